"""dataset.format=preference (objective=dpo): rows in text and conversational form become
TRL DPOTrainer's prompt_ids / chosen_ids / rejected_ids through the run's chat template;
every refusal (bad row, a prompt with no room for its answer, packing) names where it is
and the fix; the scan catches the bad rows before launch. No model, no ranks."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from launcher.config.compose import compose_config
from launcher.data import loading
from launcher.data.datascan import scan_file
from launcher.data.formats import FIELDS, RowError, column_map, pair_of, row_problem
from launcher.data.preprocess import data_dir, data_key, ensure_prepared
from launcher.errors import ConfigError, DataError
from launcher.inference.examples import held_out_prompts
from launcher.validation.validate import validate

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = column_map("preference", {})

TEXT_ROW = {"prompt": "65+61", "chosen": "126 (checked)", "rejected": "126"}
QUESTION = [{"role": "system", "content": "Be exact."},
            {"role": "user", "content": "What is 2+2?"}]
CONVERSATIONAL_ROW = {  # the prompt implied: the turns chosen and rejected share
    "chosen": [*QUESTION, {"role": "assistant", "content": "4"}],
    "rejected": [*QUESTION, {"role": "assistant", "content": "5"}],
}
SHAREGPT_TURNS_ROW = {  # from/value turns, an explicit prompt of turns, answers apart
    "prompt": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."},
               {"from": "human", "value": "Name a colour."}],
    "chosen": [{"from": "gpt", "value": "Blue."}],
    "rejected": [{"from": "gpt", "value": "Tuesday."}],
}

BUILTIN_TEXT = "<s>### Human:\n65+61\n\n### Assistant:\n"


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ROOT / "assets" / "tokenizer"))
    assert not getattr(tokenizer, "chat_template", None), "built-in template expected"
    return tokenizer


@functools.cache
def config(max_length: int) -> Any:
    return compose_config(["dataset=prefs", "dataset.path=mem.jsonl", "dataset.eval_path=",
                           f"dataset.max_length={max_length}"])


def encode_rows(tok: Any, rows: list[dict], max_length: int = 128,
                source: str = "mem.jsonl") -> list[dict]:
    from datasets import Dataset

    records = Dataset.from_list(rows)
    encoder = loading.encoder_for(config(max_length), tok, records.column_names)
    encoded = loading.encode(records, encoder, source, None)
    assert encoded.column_names == ["prompt_ids", "chosen_ids", "rejected_ids"]
    return list(encoded)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# ---------------------------------------------------------------------------- encoding


def test_text_row_encodes_to_the_rendered_conversation_ending_in_eos(tok):
    (pair,) = encode_rows(tok, [TEXT_ROW])
    assert tok.decode(pair["prompt_ids"]) == BUILTIN_TEXT
    assert pair["prompt_ids"][0] == tok.bos_token_id  # the template's, added once
    for answer in ("chosen", "rejected"):
        ids = pair[f"{answer}_ids"]
        assert tok.decode(pair["prompt_ids"] + ids) == f"{BUILTIN_TEXT}{TEXT_ROW[answer]}</s>"
        assert ids[-1] == tok.eos_token_id
        # prompt + answer is the answer's conversation tokenized whole
        whole = tok(f"{BUILTIN_TEXT}{TEXT_ROW[answer]}</s>", add_special_tokens=False)
        assert pair["prompt_ids"] + ids == whole["input_ids"]


def test_implicit_prompt_is_the_shared_opening_turns(tok):
    pair = pair_of(CONVERSATIONAL_ROW, COLUMNS)
    assert pair.prompt == QUESTION
    assert pair.chosen == [{"role": "assistant", "content": "4"}]
    (encoded,) = encode_rows(tok, [CONVERSATIONAL_ROW])
    prompt = "<s>### System:\nBe exact.\n\n### Human:\nWhat is 2+2?\n\n### Assistant:\n"
    assert tok.decode(encoded["prompt_ids"]) == prompt
    assert tok.decode(encoded["prompt_ids"] + encoded["chosen_ids"]) == prompt + "4</s>"
    assert tok.decode(encoded["prompt_ids"] + encoded["rejected_ids"]) == prompt + "5</s>"
    assert encoded["chosen_ids"][-1] == encoded["rejected_ids"][-1] == tok.eos_token_id


def test_multi_turn_prompt_in_sharegpt_turns(tok):
    (encoded,) = encode_rows(tok, [SHAREGPT_TURNS_ROW])
    prompt = ("<s>### Human:\nHi\n\n### Assistant:\nHello.</s>### Human:\nName a colour."
              "\n\n### Assistant:\n")
    assert tok.decode(encoded["prompt_ids"]) == prompt
    assert tok.decode(encoded["chosen_ids"]) == "Blue.</s>"
    assert tok.decode(encoded["rejected_ids"]) == "Tuesday.</s>"


def test_answers_that_repeat_the_prompt_have_it_taken_off():
    row = {"prompt": "What is 2+2?", **{key: [QUESTION[1], *value[2:]]
                                        for key, value in CONVERSATIONAL_ROW.items()}}
    pair = pair_of(row, COLUMNS)
    assert pair.prompt == [QUESTION[1]]
    assert pair.chosen == [{"role": "assistant", "content": "4"}]


def test_same_pair_in_both_forms_encodes_the_same(tok):
    as_turns = {"prompt": [{"role": "user", "content": "65+61"}],
                "chosen": [{"role": "assistant", "content": "126 (checked)"}],
                "rejected": [{"role": "assistant", "content": "126"}]}
    assert encode_rows(tok, [as_turns]) == encode_rows(tok, [TEXT_ROW])


def test_answers_are_cut_from_their_end_and_the_prompt_kept_whole(tok, caplog):
    (full,) = encode_rows(tok, [TEXT_ROW])
    limit = len(full["prompt_ids"]) + 3
    with caplog.at_level(logging.WARNING, logger="launcher.data.loading"):
        (cut,) = encode_rows(tok, [TEXT_ROW], limit)
    assert cut["prompt_ids"] == full["prompt_ids"]
    assert cut["chosen_ids"] == full["chosen_ids"][:3]
    assert cut["rejected_ids"] == full["rejected_ids"][:3]
    assert "1 pair(s) with an answer cut" in caplog.text


def test_a_prompt_with_no_room_refuses_every_such_row_at_once(tok):
    long = {**TEXT_ROW, "prompt": "1+1 " * 40}
    rows = [TEXT_ROW, long, TEXT_ROW, *[long] * 7]
    with pytest.raises(DataError) as caught:
        encode_rows(tok, rows, 64, source="pairs.jsonl")
    message = str(caught.value)
    prompt_tokens = len(tok(BUILTIN_TEXT.replace("65+61", long["prompt"]),
                            add_special_tokens=False)["input_ids"])
    assert message.startswith("pairs.jsonl: 8 preference pair(s)"), message
    assert f"row 2 ({prompt_tokens} tokens), row 4 (" in message  # counted from 1
    assert "and 3 more" in message and "dataset.max_length=64" in message
    assert f"Fix: raise dataset.max_length above the longest prompt ({prompt_tokens}" in message


def test_a_held_out_split_names_rows_by_their_place_in_the_file(tok, tmp_path):
    long = {**TEXT_ROW, "prompt": "1+1 " * 40}
    path = write_jsonl(tmp_path / "pairs.jsonl", [TEXT_ROW] * 9 + [long])
    cfg = compose_config(["dataset=prefs", f"dataset.path={path}", "dataset.eval_path=",
                          "dataset.eval_fraction=0.5", "train.micro_batch_size=1",
                          "train.grad_accum=1"])
    with pytest.raises(DataError, match=r"1 preference pair\(s\) .*: row 10 \("):
        loading.encode_splits(cfg, tok, progress=False)


def test_the_train_and_eval_files_refusals_come_together(tok, tmp_path):
    long = {**TEXT_ROW, "prompt": "1+1 " * 40}
    train = write_jsonl(tmp_path / "train.jsonl", [TEXT_ROW, TEXT_ROW, long])
    evaluation = write_jsonl(tmp_path / "eval.jsonl", [long, TEXT_ROW])
    cfg = compose_config(["dataset=prefs", f"dataset.path={train}",
                          f"dataset.eval_path={evaluation}", "train.micro_batch_size=1",
                          "train.grad_accum=1"])
    with pytest.raises(DataError) as caught:
        loading.encode_splits(cfg, tok, progress=False)
    first, second = str(caught.value).splitlines()
    assert first.startswith(f"{train}: 1 preference pair(s)") and "row 3 (" in first
    assert second.startswith(f"{evaluation}: 1 preference pair(s)") and "row 1 (" in second


# ---------------------------------------------------------------------------- refusals

REFUSED = {
    "missing chosen": ({"prompt": "p", "rejected": "r"},
                       "field 'chosen' is missing"),
    "empty rejected": ({"prompt": "p", "chosen": "c", "rejected": ""},
                       "field 'rejected' is empty"),
    "empty list": ({"prompt": "p", "chosen": [], "rejected": "r"},
                   "field 'chosen' is an empty list of turns"),
    "identical": ({"prompt": "p", "chosen": "same", "rejected": "same"},
                  "hold the same answer"),
    "identical turns": ({"chosen": CONVERSATIONAL_ROW["chosen"],
                         "rejected": CONVERSATIONAL_ROW["chosen"]}, "hold the same answer"),
    "text without prompt": ({"chosen": "c", "rejected": "r"},
                            "field 'prompt' is missing: with a text answer"),
    "not ending in assistant": (
        {"chosen": [*CONVERSATIONAL_ROW["chosen"], {"role": "user", "content": "ok?"}],
         "rejected": CONVERSATIONAL_ROW["rejected"]},
        "field 'chosen': the answer ends with a user turn"),
    "no answer left": ({"chosen": CONVERSATIONAL_ROW["chosen"][:2],
                        "rejected": CONVERSATIONAL_ROW["rejected"]},
                       "field 'chosen' has no turn after the prompt"),
    "prompt without user": ({"prompt": [QUESTION[0]], "chosen": "c", "rejected": "r"},
                            "the prompt (field 'prompt') has no user turn"),
    "one object": ({"prompt": "p", "chosen": {"role": "assistant", "content": "c"},
                    "rejected": "r"}, "field 'chosen' is one object"),
    "bad role": ({"chosen": [{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}],
                  "rejected": [{"role": "user", "content": "q"}]},
                 "field 'chosen': turn 1 has role 'bot'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_row_is_a_row_problem(case):
    row, expected = REFUSED[case]
    problem = row_problem(row, "preference", COLUMNS)
    assert problem is not None and expected in problem, problem
    with pytest.raises(RowError):
        pair_of(row, COLUMNS)


def test_scan_names_file_line_and_fix_of_every_bad_row(tmp_path):
    cases = sorted(REFUSED)
    path = write_jsonl(tmp_path / "pairs.jsonl",
                       [TEXT_ROW, CONVERSATIONAL_ROW] + [REFUSED[c][0] for c in cases])
    scan = scan_file(path, "preference", {}, limit=20)
    assert scan.rows == len(cases) + 2
    assert len(scan.problems) == len(cases), scan.problems
    for line, (case, problem) in enumerate(zip(cases, scan.problems, strict=True), start=3):
        assert problem.startswith(f"{path}:{line}: "), problem
        assert REFUSED[case][1] in problem and f"Fix: correct or remove line {line}" in problem
    missing = scan.problems[cases.index("missing chosen")]
    assert "dataset.columns.chosen=NAME" in missing  # a naming mismatch is suggested


def test_encoding_names_the_bad_row_too(tok):
    with pytest.raises(DataError, match=r"^mem.jsonl: row 2: .*hold the same answer"):
        encode_rows(tok, [TEXT_ROW, REFUSED["identical"][0]])


def test_renamed_columns():
    renames = {"prompt": "question", "chosen": "good", "rejected": "bad"}
    columns = column_map("preference", renames)
    row = {"question": "q", "good": "g", "bad": "b"}
    assert pair_of(row, columns).chosen == [{"role": "assistant", "content": "g"}]
    assert FIELDS["preference"] == {"prompt": False, "chosen": True, "rejected": True}


def test_packing_is_refused_as_a_config_problem():
    cfg = compose_config(["dataset=prefs", "dataset.packing=true"])
    with pytest.raises(ConfigError) as caught:
        validate(cfg, "preprocess")
    (problem,) = [p for p in caught.value.problems if "dataset.packing" in p]
    assert "dataset.format=preference" in problem and "Fix: dataset.packing=false" in problem


# ---------------------------------------------------------------------------- the demo data


def test_demo_pairs_prepare_with_no_warning_and_their_figures(tok, tmp_path, caplog):
    cfg = compose_config(["dataset=prefs", f"dataset.cache_dir={tmp_path}"])
    assert scan_file(ROOT / cfg.dataset.path, "preference", {}).problems == []
    with caplog.at_level(logging.WARNING, logger="launcher.data.loading"):
        prepared = ensure_prepared(cfg, data_dir(cfg), tok, progress=False)
    assert "pair(s)" not in caplog.text, caplog.text
    from datasets import load_from_disk

    train = load_from_disk(prepared.train)
    assert prepared.rows == len(train) == 1200 and prepared.eval is not None
    prompt, chosen, rejected = (sum(map(len, train[c]))
                                for c in ("prompt_ids", "chosen_ids", "rejected_ids"))
    assert prepared.tokens == 2 * prompt + chosen + rejected
    assert prepared.trained_tokens == chosen + rejected
    assert prepared.fill == round((2 * prompt + chosen + rejected)
                                  / (2 * 1200 * cfg.dataset.max_length), 4)
    assert all(len(p) + max(len(c), len(r)) <= cfg.dataset.max_length
               for p, c, r in zip(train["prompt_ids"], train["chosen_ids"],
                                  train["rejected_ids"], strict=True))


def test_data_key_changes_with_the_format():
    prefs = compose_config(["dataset=prefs"])
    other = compose_config(["dataset=prefs", "dataset.format=prompt_completion",
                            "dataset.columns.completion=chosen"])
    assert data_key(prefs) != data_key(other)


def test_held_out_prompts_skip_preference_rows():
    assert held_out_prompts(compose_config(["dataset=prefs"]), 5) == []


def test_quantize_refuses_preference_data_for_its_perplexity(tmp_path):
    from launcher.inference.quantize import Request, check_request

    request = Request(model_dir=tmp_path / "model", out_dir=tmp_path / "out", scheme="absmax",
                      granularity="channel", clip_percentile=None, compare=False,
                      force=False, overrides=["dataset=prefs"])
    with pytest.raises(ConfigError) as caught:
        check_request(request)
    assert any(p.startswith("dataset.format=preference: the perplexity")
               for p in caught.value.problems), caught.value.problems
