"""`train.show_examples=N`: held-out prompts answered before and after training, in the
launcher process once the ranks have finished, on its CPU (small models only). The prompts
are the eval set's conversations up to their first assistant turn (the reference is that
turn), rendered by `chat.prompt_ids` with the run's saved tokenizer: the model is asked what
it was trained on, as `ftl chat` would ask it. The initial model is the ranks' (model.path,
else rebuilt from the architecture with train.seed), so the before/after rates compare the
same weights the run started from. Prompts of one token length share a batch without
padding. Prints a few, with the exact-match rates over all N, and writes examples.json.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.data.formats import CHAT_FORMATS, column_map, messages_of
from launcher.data.mixture import formats
from launcher.engines.pretrained import NO_HUB_KERNELS
from launcher.inference.chat import answers, load_for_inference
from launcher.rundir import RunDir
from launcher.rundir.records import Example, ExamplesRecord

if TYPE_CHECKING:
    from launcher.config.schema import RunConfig

SHOWN = 5
"""Rows of the printed table; the rate counts every prompt."""
WIDTH = 18
"""Characters of a printed cell."""

Prompt = tuple[list[dict[str, str]], str]
"""(the conversation up to the answer, the reference answer)."""


def held_out_prompts(cfg: RunConfig, count: int) -> list[Prompt]:
    """The first `count` rows of the eval set as (messages before the first assistant turn,
    that turn's text); none for formats whose rows are not one conversation (raw text,
    preference pairs). A mixture's eval set is its sources' held-out rows, in turn."""
    read = {cfg.dataset.format} if cfg.dataset.eval_path else formats(cfg)
    if not read & set(CHAT_FORMATS):
        return []
    import datasets

    from launcher.data.loading import eval_records

    datasets.disable_progress_bars()  # the launcher's console shows the table only
    prompts: list[Prompt] = []
    for one, evaluation, _ in eval_records(cfg):
        fmt = one.dataset.format
        if fmt not in CHAT_FORMATS or len(prompts) >= count:
            continue
        columns = column_map(fmt, asdict(one.dataset.columns), evaluation.column_names)
        for row in evaluation.select(range(min(count - len(prompts), len(evaluation)))):
            messages = messages_of(row, fmt, columns)
            first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
            # an opening reply (no user turn before it) asks nothing
            if any(m["role"] == "user" for m in messages[:first]):
                prompts.append((messages[:first], messages[first]["content"]))
    return prompts


def initial_model(cfg: RunConfig, tokenizer: Any) -> Any:
    """The weights the run started from, in fp32 on the CPU: `model.path`, else the
    architecture built with `train.seed` as the ranks built it (launcher/rank/model.py)."""
    import torch
    from transformers import AutoModelForCausalLM

    from launcher.rank.model import model_config

    if cfg.model.path:
        return AutoModelForCausalLM.from_pretrained(cfg.model.path, **NO_HUB_KERNELS).eval()
    # The init draws from torch's generator only: seeding it as transformers.set_seed does
    # gives the ranks' weights without importing transformers.trainer_utils (which loads
    # bitsandbytes and its noisy kernel probe).
    torch.manual_seed(cfg.train.seed)
    return AutoModelForCausalLM.from_config(model_config(cfg, tokenizer)).eval()


def last_user_turn(messages: list[dict[str, str]]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def exact(answer: str, reference: str) -> bool:
    return answer.strip() == reference.strip()


def compare(cfg: RunConfig, run_dir: RunDir) -> ExamplesRecord:
    """Answer the held-out prompts with the initial and the final model; writes nothing."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    prompts = held_out_prompts(cfg, cfg.train.show_examples)
    final, tokenizer = load_for_inference(run_dir.model)
    conversations = [messages for messages, _ in prompts]
    # One token more than the longest reference: a longer answer cannot match anyway.
    budget = 1 + max((len(tokenizer(ref, add_special_tokens=False)["input_ids"])
                      for _, ref in prompts), default=0)
    after = answers(final, tokenizer, conversations, budget)
    before = answers(initial_model(cfg, tokenizer), tokenizer, conversations, budget)
    rows = [Example(prompt=last_user_turn(messages), expected=ref, before=b, after=a)
            for (messages, ref), b, a in zip(prompts, before, after, strict=True)]
    return ExamplesRecord(
        count=len(rows),
        exact_before=rate(exact(r.before, r.expected) for r in rows),
        exact_after=rate(exact(r.after, r.expected) for r in rows),
        examples=rows,
    )


def rate(hits: Iterable[bool]) -> float:
    marks = list(hits)
    return sum(marks) / len(marks) if marks else 0.0


def table(record: ExamplesRecord, where: Path) -> str:
    """The printed summary: a few prompts, their answers before and after, the rates."""
    def cell(text: str) -> str:
        # an untrained model emits stray bytes (U+FFFD once decoded) and control characters
        shown = "".join(c if c.isprintable() and c != "\ufffd" else "?"
                        for c in text.strip().replace("\n", "\\n")) or "(empty)"
        return shown if len(shown) <= WIDTH else shown[:WIDTH - 3] + "..."

    header = ("prompt", "expected", "before", "after", "")
    rows = [header] + [(cell(r.prompt), cell(r.expected), cell(r.before), cell(r.after),
                        "ok" if exact(r.after, r.expected) else "wrong")
                       for r in record.examples[:SHOWN]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"ftl train: {record.count} held-out prompts, greedy answers of the initial and "
             f"the final model ({where}):"]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    lines.append(f"  exact match: {record.exact_before:.1%} before training, "
                 f"{record.exact_after:.1%} after ({record.count} prompts)")
    return "\n".join(lines)


def show_examples(cfg: RunConfig, run_dir: RunDir) -> ExamplesRecord | None:
    """`ftl train`'s last step: compare, write examples.json, print the table. Raw text
    formats have no prompt and answer to compare: a notice, nothing written."""
    if cfg.dataset.format not in CHAT_FORMATS:
        print(f"ftl train: train.show_examples={cfg.train.show_examples} skipped: "
              f"dataset.format={cfg.dataset.format} rows have no prompt and answer "
              f"(formats {', '.join(CHAT_FORMATS)} do)", flush=True)
        return None
    record = compare(cfg, run_dir)
    run_dir.write_examples(record)
    print(table(record, run_dir.examples), flush=True)
    return record
