"""Fine-tuning a pretrained chat model on chat data with packing, on 2 ranks, under ddp,
zero3 and fsdp: the data path as users meet it (`dataset.format=chat dataset.packing=true
model.path=DIR`), started through the run dir's own command like `ftl submit`'s job, so
rank 0 tokenizes while rank 1 waits.

The chat model is the suite's own pretrained tiny Llama (conftest.pretrained_dir) given
ChatML special tokens and template, as Qwen ships them."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from runs import Run, describe_failure

from launcher.config.compose import PROJECT_ROOT

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The data path has no strategy-specific code: `make test` packs under zero3 (the resized
# embeddings partitioned), `make test-full` under ddp and fsdp too.
STRATEGIES = ("zero3", *[pytest.param(s, marks=pytest.mark.full) for s in ("ddp", "fsdp")])


@pytest.fixture(scope="module")
def chat_model(pretrained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pretrained checkpoint with ChatML markers as new special tokens (embeddings
    resized) and the ChatML template in its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("chat-model")
    tokenizer = AutoTokenizer.from_pretrained(pretrained_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    model = AutoModelForCausalLM.from_pretrained(pretrained_dir)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Conversations of 1 to 3 exchanges (variable lengths) from the bundled tasks, some
    with a system turn, some in ShareGPT's from/value spelling."""
    rows = [json.loads(line) for line in
            (PROJECT_ROOT / "data/arith/train.jsonl").read_text().splitlines()]
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("chat-data") / "chats.jsonl"
    with path.open("w") as handle:
        for index in range(400):
            turns = [{"role": "system", "content": "Answer briefly."}] if index % 3 == 0 else []
            for row in rng.sample(rows, rng.randint(1, 3)):
                turns += [{"role": "user", "content": row["instruction"]},
                          {"role": "assistant", "content": row["output"]}]
            if index % 4 == 0:
                turns = [{"from": {"user": "human", "assistant": "gpt"}.get(t["role"], t["role"]),
                          "value": t["content"]} for t in turns]
            handle.write(json.dumps({"messages": turns}) + "\n")
    return path


def chat_run(trained: Callable[..., Run], model: Path, data: Path, strategy: str) -> Run:
    cache = data.parent / f"cache-{strategy}"  # one per run: each run's rank 0 tokenizes
    return trained(f"chat-packed-{strategy}", [
        f"strategy={strategy}", f"model.path={model}", "model.tokenizer=",
        f"dataset.path={data}", "dataset.eval_path=", "dataset.eval_fraction=0.05",
        "dataset.format=chat", "dataset.packing=true", "dataset.max_length=128",
        f"dataset.cache_dir={cache}", "train.max_steps=10", "train.lr=1e-3",
    ])


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_chat_packed_finetune_from_a_pretrained_chat_model(
    trained: Callable[..., Run], chat_model: Path, chat_file: Path, strategy: str
) -> None:
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    run = chat_run(trained, chat_model, chat_file, strategy)
    assert run.returncode == 0, describe_failure(run)
    result = run.result
    assert result["world_size"] == 2
    assert result["final_eval_loss"] < result["first_eval_loss"] - 0.1, result

    # Tokenized once, by rank 0; rank 1 only waited for it.
    (cache,) = (chat_file.parent / f"cache-{strategy}").iterdir()
    meta = json.loads((cache / "meta.json").read_text())
    assert meta["built_by"].startswith("rank 0 ")
    rank_lines = [line for line in run.output.splitlines() if "[ftl] rank " in line]
    assert any("rank 0: tokenized" in line for line in rank_lines), rank_lines
    assert not any("rank 1: tokenized" in line for line in rank_lines)

    # Packed rows of whole examples, each restarting its positions.
    train = load_from_disk(str(cache / "train"))
    assert set(train.column_names) == {"input_ids", "labels", "position_ids"}
    examples = sum(row.count(0) for row in train["position_ids"])
    assert examples == 380 and len(train) == meta["prepared"]["rows"] < examples

    # The saved model still speaks ChatML: its tokenizer carries the template it learned.
    saved = AutoTokenizer.from_pretrained(run.run_dir / "model")
    assert saved.chat_template == CHATML
