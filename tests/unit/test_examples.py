"""launcher/inference/examples.py (`train.show_examples`): which held-out prompts, rendered
how, answered by which initial model, scored and shown how. On the embedded default's tiny
Llama built here, untrained. `ftl train` writing and printing them after a real (short)
run: tests/integration/test_ftl_train.py, whose `full` case checks the default's >= 90 %
exact match."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from launcher.config.compose import PROJECT_ROOT, compose_config
from launcher.data import loading
from launcher.data.encode import IGNORE_INDEX, adopt_chat_template
from launcher.data.tokenizer import load_tokenizer
from launcher.engines import engine_of
from launcher.inference import examples
from launcher.inference.chat import answers, prompt_ids
from launcher.rank.model import build_model
from launcher.rundir import RunDir
from launcher.rundir.records import Example, ExamplesRecord

CFG = compose_config([])
"""The embedded default: tiny Llama, data/arith, show_examples from its preset."""
EVAL_ROWS = [json.loads(line) for line in
             (PROJECT_ROOT / "data/arith/eval.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The tokenizer as the run saves it: with the template its data was rendered in."""
    return adopt_chat_template(load_tokenizer(CFG), CFG.dataset)


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    return examples.initial_model(CFG, tokenizer)


def test_the_preset_turns_it_on_and_the_schema_leaves_it_off() -> None:
    assert CFG.train.show_examples == 200
    assert compose_config(["model=llama-7b"]).train.show_examples == 0


def test_the_initial_model_is_the_one_the_ranks_start_from(model: Any, tokenizer: Any) -> None:
    # launcher/rank/model.py, set_seed
    ranks = build_model(CFG, engine_of(CFG.strategy), tokenizer).state_dict()
    mine = model.state_dict()
    assert mine.keys() == ranks.keys()
    assert all(torch.equal(mine[name], ranks[name]) for name in ranks)


def test_the_prompts_are_the_eval_sets_first_rows() -> None:
    prompts = examples.held_out_prompts(CFG, 3)
    assert prompts == [([{"role": "user", "content": row["instruction"]}], row["output"])
                       for row in EVAL_ROWS[:3]]
    assert len(examples.held_out_prompts(CFG, 10_000)) == len(EVAL_ROWS)
    # without an eval file: the share of dataset.path held out for evaluation
    split = compose_config(["dataset.eval_path=", "dataset.eval_fraction=0.01"])
    held = loading.split_records(split)[1]
    assert [m[0]["content"] for m, _ in examples.held_out_prompts(split, 5)] == [
        row["instruction"] for row in held.select(range(5))]


def test_a_conversations_prompt_ends_before_its_first_reply(tmp_path: Path) -> None:
    system, user = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1"}
    convs = [
        [system, user, {"role": "assistant", "content": "2"}, user,
         {"role": "assistant", "content": "again 2"}],
        [{"role": "assistant", "content": "Hello!"}, user,  # an opening reply asks nothing
         {"role": "assistant", "content": "2"}],
    ]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs))
    cfg = compose_config(["dataset=chat", f"dataset.path={path}", f"dataset.eval_path={path}"])
    assert examples.held_out_prompts(cfg, 2) == [([system, user], "2")]
    assert examples.last_user_turn([system, user]) == "1+1"


def test_a_prompt_is_the_text_training_put_before_the_answer(tokenizer: Any) -> None:
    """What the model is asked (by `ftl chat` as by the examples) is token for token what
    preceded the trained answer in its training example."""
    rows = loading.load_records(CFG.dataset.eval_path, "alpaca")
    encoder = loading.encoder_for(CFG, tokenizer, rows.column_names)
    encoded = loading.encode(rows.select(range(5)), encoder, "eval", None)
    for (messages, answer), ids, labels in zip(examples.held_out_prompts(CFG, 5),
                                               encoded["input_ids"], encoded["labels"],
                                               strict=True):
        first_trained = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
        assert prompt_ids(tokenizer, messages) == ids[:first_trained]
        assert tokenizer.decode(ids[first_trained:]) == answer + tokenizer.eos_token


def test_a_batch_answers_what_ftl_chat_answers_each_prompt(model: Any, tokenizer: Any) -> None:
    prompts = ["12+30", "7+5", "123+456", "12+31"]  # three lengths
    conversations = [[{"role": "user", "content": p}] for p in prompts]
    batched = examples.answers(model, tokenizer, conversations, 4)
    assert batched == [answers(model, tokenizer, [c], 4)[0] for c in conversations]
    assert len(set(batched)) > 1  # distinct answers, each in its prompt's place


def test_the_table_marks_each_answer_and_states_both_rates(tmp_path: Path) -> None:
    rows = [Example("12+30", "42", "8N\ufffd\x07", "42"), Example("22+13", "35", "", " 35\n"),
            Example("90+94", "184", "x" * 40, "174")]
    record = ExamplesRecord(
        count=3, exact_before=examples.rate(examples.exact(r.before, r.expected) for r in rows),
        exact_after=examples.rate(examples.exact(r.after, r.expected) for r in rows),
        examples=rows)
    assert (record.exact_before, record.exact_after) == (0.0, pytest.approx(2 / 3))
    lines = examples.table(record, tmp_path / "examples.json").splitlines()
    assert lines[1].split() == ["prompt", "expected", "before", "after"]
    assert lines[2].split() == ["12+30", "42", "8N??", "42", "ok"]
    assert lines[3].split() == ["22+13", "35", "(empty)", "35", "ok"]
    assert lines[4].split() == ["90+94", "184", "x" * 15 + "...", "174", "wrong"]
    assert lines[-1] == "  exact match: 0.0% before training, 66.7% after (3 prompts)"


def test_rows_without_a_prompt_and_answer_skip_with_a_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = compose_config(["dataset.format=text"])
    assert examples.show_examples(cfg, RunDir(tmp_path)) is None
    assert "train.show_examples=200 skipped: dataset.format=text" in capsys.readouterr().out
    assert not RunDir(tmp_path).examples.exists()
