"""launcher/data.py and the bundled data: loading, templates, masking, packing, splits."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher import data
from launcher.compose import compose_config
from launcher.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "assets" / "tokenizer"
BUNDLED = ROOT / "data" / "arith"

ALPACA = [
    {"instruction": "Add the two numbers.", "input": "12 30", "output": "42"},
    {"instruction": "Say hi.", "input": "", "output": "hi"},
    {"instruction": "Reverse the word.", "input": "kodami", "output": "imadok"},
]
SHAREGPT = [
    {"conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Add 1 2"},
        {"from": "gpt", "value": "3"},
        {"from": "human", "value": "Add 2 2"},
        {"from": "gpt", "value": "4"},
    ]},
    {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
]
TEXT = [{"text": "the cat sat"}, {"text": "on the mat"}]


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def write(path: Path, rows: list[dict]) -> Path:
    """Write rows as .json (array), .jsonl, .csv or .parquet, by the path's suffix."""
    if path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def labelled(tok: Any, example: dict) -> str:
    return tok.decode([t for t in example["labels"] if t != data.IGNORE_INDEX])


# ------------------------------------------------------------------------- loading formats


@pytest.mark.parametrize("ext", [".json", ".jsonl", ".csv", ".parquet"])
@pytest.mark.parametrize(("fmt", "rows"), [("alpaca", ALPACA), ("text", TEXT)])
def test_flat_formats_load_from_every_file_type(tmp_path, tok, ext, fmt, rows):
    records = data.load_records(str(write(tmp_path / f"d{ext}", rows)), fmt)
    assert len(records) == len(rows)
    examples = data.tokenize(records, fmt, tok, max_length=64)
    responses = [labelled(tok, e) for e in examples]
    expected = [(r["output"] if fmt == "alpaca" else r["text"]) + "</s>" for r in rows]
    assert responses == expected


@pytest.mark.parametrize("ext", [".json", ".jsonl", ".parquet"])
def test_sharegpt_loads_and_trains_on_every_assistant_turn(tmp_path, tok, ext):
    records = data.load_records(str(write(tmp_path / f"c{ext}", SHAREGPT)), "sharegpt")
    first, second = data.tokenize(records, "sharegpt", tok, max_length=128)
    assert labelled(tok, first) == "3</s>4</s>"
    assert labelled(tok, second) == "Hello</s>"
    text = tok.decode(first["input_ids"])
    assert text.startswith("<s>### System:\nBe brief.\n\n### Human:\nAdd 1 2\n\n### Assistant:\n3")


def test_alpaca_template_leaves_out_empty_input():
    pieces = data.render(ALPACA[1], "alpaca", "</s>")
    assert pieces == [("### Instruction:\nSay hi.\n\n### Response:\n", False), ("hi</s>", True)]
    prompt = data.render(ALPACA[0], "alpaca")[0][0]
    assert prompt == (
        "### Instruction:\nAdd the two numbers.\n\n### Input:\n12 30\n\n### Response:\n"
    )


# ------------------------------------------------------------------------- errors


def test_missing_field_names_field_file_and_fix(tmp_path):
    path = write(tmp_path / "bad.jsonl", [{"instruction": "x", "answer": "y"}])
    with pytest.raises(DataError) as err:
        data.load_records(str(path), "alpaca")
    message = str(err.value)
    assert "needs field(s) 'output' but" in message and str(path) in message
    assert "dataset.format" in message and "conversations" in message


def test_sharegpt_file_read_as_alpaca_names_both_fields(tmp_path):
    path = write(tmp_path / "chat.json", SHAREGPT)
    with pytest.raises(DataError, match=r"'instruction', 'output'"):
        data.load_records(str(path), "alpaca")


def test_missing_file_and_bad_extension(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl not found.*dataset\.path"):
        data.load_records(str(tmp_path / "nope.jsonl"), "alpaca")
    odd = tmp_path / "d.txt"
    odd.write_text("hello")
    with pytest.raises(DataError, match=r"d\.txt: unsupported file type '\.txt'"):
        data.load_records(str(odd), "text")


def test_local_directory_loads_and_hub_ids_go_to_the_hub(tmp_path, monkeypatch):
    write(tmp_path / "train.jsonl", ALPACA)
    assert len(data.load_records(str(tmp_path), "alpaca")) == 3

    def no_hub(dataset_id: str) -> None:
        raise DataError(f"hub asked for {dataset_id}")

    monkeypatch.setattr(data, "_load_hub", no_hub)
    with pytest.raises(DataError, match="hub asked for tatsu-lab/alpaca"):
        data.load_records("tatsu-lab/alpaca", "alpaca")
    with pytest.raises(DataError, match="not found"):  # a file name is never a hub id
        data.load_records("data/sharegpt.jsonl", "sharegpt")


def test_empty_required_value_names_row(tmp_path, tok):
    rows = [ALPACA[0], {"instruction": "x", "input": "", "output": None}]
    records = data.load_records(str(write(tmp_path / "d.jsonl", rows)), "alpaca")
    with pytest.raises(DataError, match=r"d\.jsonl: row 1: field 'output' is empty"):
        data.tokenize(records, "alpaca", tok, 64, source=str(tmp_path / "d.jsonl"))


def test_bad_sharegpt_role_is_a_data_error(tok):
    rows = [{"conversations": [{"from": "bot", "value": "x"}]}]
    with pytest.raises(DataError, match="row 0: turn role 'bot'"):
        data.tokenize(rows, "sharegpt", tok, 64)


def test_unknown_format_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="dataset.format='chatml'"):
        data.load_records(str(write(tmp_path / "d.jsonl", TEXT)), "chatml")


# ------------------------------------------------------------------------- masking, truncation


def test_mask_covers_exactly_the_prompt(tok):
    record = ALPACA[0]
    (prompt, _), (response, _) = data.render(record, "alpaca", tok.eos_token)
    (example,) = data.tokenize([record], "alpaca", tok, max_length=64)
    ids, labels = example["input_ids"], example["labels"]
    assert ids == tok(prompt + response)["input_ids"]  # the tokenizer adds <s> itself
    n_prompt = 1 + len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert labels[:n_prompt] == [data.IGNORE_INDEX] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:]
    assert ids[-1] == tok.eos_token_id


def test_without_mask_prompt_everything_but_bos_trains(tok):
    (example,) = data.tokenize([ALPACA[0]], "alpaca", tok, 64, mask_prompt=False)
    assert example["labels"] == [data.IGNORE_INDEX] + example["input_ids"][1:]


def test_truncation_and_dropping(tok, caplog):
    prompt = data.render(ALPACA[0], "alpaca")[0][0]
    n_prompt = 1 + len(tok(prompt, add_special_tokens=False)["input_ids"])
    (short,) = data.tokenize([ALPACA[0]], "alpaca", tok, max_length=n_prompt + 1)
    (full,) = data.tokenize([ALPACA[0]], "alpaca", tok, max_length=64)
    assert short["input_ids"] == full["input_ids"][: n_prompt + 1]
    assert short["labels"][-1] == full["input_ids"][n_prompt]  # one response token left
    long_prompt = {"instruction": "word " * 40, "input": "", "output": "x"}
    kept = data.tokenize([long_prompt, ALPACA[0]], "alpaca", tok, max_length=30)
    assert len(kept) == 1 and "dropped 1 example" in caplog.text
    with pytest.raises(DataError, match="raise dataset.max_length"):
        data.tokenize([long_prompt], "alpaca", tok, max_length=30)


# ------------------------------------------------------------------------- packing, collator


def test_packing_blocks_preserve_tokens_and_masks(tok):
    rows = ALPACA * 5
    examples = data.tokenize(rows, "alpaca", tok, max_length=None)
    blocks = data.pack(examples, 32)
    total = sum(len(e["input_ids"]) for e in examples)
    assert total > 3 * 32 and total % 32 != 0
    assert [len(b["input_ids"]) for b in blocks] == [32] * (total // 32) + [total % 32]
    assert [t for b in blocks for t in b["input_ids"]] == [
        t for e in examples for t in e["input_ids"]
    ]
    assert [t for b in blocks for t in b["labels"]] == [t for e in examples for t in e["labels"]]


def test_prepare_with_packing_does_not_truncate(tok):
    cfg = compose_config(["dataset.packing=true", "dataset.max_length=16"]).dataset
    long_row = {"instruction": "word " * 30, "input": "", "output": "done"}
    packed = data.prepare([long_row, ALPACA[0]], cfg, tok, "rows")
    unpacked = data.tokenize([long_row, ALPACA[0]], "alpaca", tok, None)
    assert sum(len(r) for r in packed["input_ids"]) == sum(len(e["input_ids"]) for e in unpacked)
    assert max(len(r) for r in packed["input_ids"]) == 16


def test_collator_pads_right_with_ignored_labels(tok):
    rows = [
        {"input_ids": [1, 5, 6], "labels": [-100, 5, 6]},
        {"input_ids": [1, 7], "labels": [-100, 7]},
    ]
    batch = data.collator(tok)(rows)
    assert batch["input_ids"].tolist() == [[1, 5, 6], [1, 7, tok.pad_token_id]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 5, 6], [-100, 7, -100]]


def test_collator_pads_with_eos_when_tokenizer_has_no_pad():
    class NoPad:
        pad_token_id = None
        eos_token_id = 2

    assert data.collator(NoPad()).pad_token_id == 2


# ------------------------------------------------------------------------- splits


def held_out(seed: int, fraction: float = 0.1) -> tuple[list, list]:
    cfg = compose_config(["dataset.eval_path=", f"dataset.eval_fraction={fraction}",
                          f"train.seed={seed}"])
    train, evaluation, _ = data.split_records(cfg)
    key = ("instruction", "input")
    return [tuple(r[k] for k in key) for r in train], [tuple(r[k] for k in key) for r in evaluation]


def test_held_out_split_is_disjoint_deterministic_and_seeded():
    train, evaluation = held_out(seed=7)
    assert len(evaluation) == 300 and len(train) == 2700
    assert not set(train) & set(evaluation)
    assert held_out(seed=7) == (train, evaluation)
    assert held_out(seed=8)[1] != evaluation


def test_zero_eval_fraction_gives_no_eval():
    cfg = compose_config(["dataset.eval_path=", "dataset.eval_fraction=0"])
    assert data.split_records(cfg)[1] is None


def test_build_datasets_and_count_tokens_on_the_default(tok):
    cfg = compose_config([])
    train, evaluation = data.build_datasets(cfg, tok)
    assert (len(train), len(evaluation)) == (3000, 200)
    assert set(train.column_names) == {"input_ids", "labels"}
    assert data.count_tokens(cfg, tok) == sum(len(r) for r in train["input_ids"])


# ------------------------------------------------------------------------- bundled data


def test_bundled_tokenizer_fits_tiny_llama(tok):
    model = compose_config([]).model
    assert len(tok) == model.vocab_size == 512
    assert (tok.unk_token, tok.bos_token, tok.eos_token, tok.pad_token) == (
        "<unk>", "<s>", "</s>", "<pad>")
    assert tok.decode(tok("Add 12 30")["input_ids"], skip_special_tokens=True) == "Add 12 30"
    assert tok.convert_ids_to_tokens(tok("1234", add_special_tokens=False)["input_ids"]) == list(
        "1234")


@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_bundled_example_fits_the_context(tok, split):
    records = data.load_records(str(BUNDLED / f"{split}.jsonl"), "alpaca")
    lengths = [len(e["input_ids"]) for e in data.tokenize(records, "alpaca", tok, None)]
    assert len(lengths) == {"train": 3000, "eval": 200}[split]
    assert max(lengths) <= 48 <= compose_config([]).dataset.max_length


def test_bundled_eval_is_disjoint_from_train():
    def keys(split: str) -> set:
        lines = (BUNDLED / f"{split}.jsonl").read_text().splitlines()
        return {(row["instruction"], row["input"]) for row in map(json.loads, lines)}

    assert len(keys("train")) == 3000 and len(keys("eval")) == 200
    assert not keys("train") & keys("eval")


def test_generator_reproduces_the_committed_files(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_data.py"),
         "--data-dir", str(tmp_path / "data"), "--tokenizer-dir", str(tmp_path / "tok")],
        check=True, capture_output=True,
    )
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / "data" / name).read_bytes() == (BUNDLED / name).read_bytes(), name
    for path in sorted(TOKENIZER_DIR.iterdir()):
        assert (tmp_path / "tok" / path.name).read_bytes() == path.read_bytes(), path.name
