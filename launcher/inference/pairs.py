"""`train.show_examples=N` on a DPO run: the share of the first N held-out preference
pairs whose chosen answer the model's own log-likelihood (the sum over the answer's
tokens, given the prompt) ranks above the rejected one, with the initial model and the
final one. TRL's `eval_rewards/accuracies` compares the policy to the reference, so it is
0 before training by definition; this rate is the model's own preference, before and
after. The pairs are the run's tokenized eval set (its plan's data dir), the ids the
ranks trained on, scored on the launcher's CPU: for small models.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.data.encode import PAIR_COLUMNS
from launcher.rundir import RunDir
from launcher.rundir.records import PairsRecord

if TYPE_CHECKING:
    from launcher.config.schema import RunConfig

Pair = tuple[list[int], list[int], list[int]]
"""(prompt ids, chosen ids, rejected ids)."""


def held_out_pairs(data_dir: Path, count: int) -> list[Pair]:
    from datasets import load_from_disk

    evaluation = data_dir / "eval"
    if not evaluation.is_dir():
        return []
    rows = load_from_disk(str(evaluation))
    rows = rows.select(range(min(count, len(rows))))
    return [tuple(r[column] for column in PAIR_COLUMNS) for r in rows]


def answer_logp(model: Any, prompt: list[int], answer: list[int]) -> float:
    """log p(answer | prompt), summed over the answer's tokens."""
    import torch

    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    logps = torch.log_softmax(logits, dim=-1)
    return float(logps.gather(1, torch.tensor(answer)[:, None]).sum())


def ranked_rate(model: Any, pairs: list[Pair]) -> float:
    """The share of pairs whose chosen answer is the more likely one."""
    ranked = [answer_logp(model, p, c) > answer_logp(model, p, r) for p, c, r in pairs]
    return sum(ranked) / len(ranked) if ranked else 0.0


def show_pairs(cfg: RunConfig, run_dir: RunDir) -> PairsRecord | None:
    """`ftl train`'s last step on a DPO run: rank the pairs, write pairs.json, print."""
    from launcher.inference.chat import load_for_inference
    from launcher.inference.examples import initial_model

    pairs = held_out_pairs(Path(run_dir.read_plan().data_dir), cfg.train.show_examples)
    if not pairs:
        return None
    final, tokenizer = load_for_inference(run_dir.model)
    record = PairsRecord(count=len(pairs),
                         ranked_before=ranked_rate(initial_model(cfg, tokenizer), pairs),
                         ranked_after=ranked_rate(final, pairs))
    run_dir.write_pairs(record)
    print(f"ftl train: {record.count} held-out pairs, chosen answer more likely than the "
          f"rejected one: {record.ranked_before:.1%} before training, "
          f"{record.ranked_after:.1%} after ({run_dir.pairs})", flush=True)
    return record
