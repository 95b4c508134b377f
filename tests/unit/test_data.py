"""launcher/data/loading.py and the bundled data: loading, column checks, splits, encoding the
default, collators. Templates and masking: test_encode.py; packing: test_packing.py."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.config.compose import compose_config
from launcher.data import loading as data
from launcher.errors import DataError

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


def labelled(tok: Any, labels: list[int]) -> str:
    return tok.decode([t for t in labels if t != data.IGNORE_INDEX])


def encoded(tok: Any, path: Path, overrides: list[str]) -> Any:
    cfg = compose_config([f"dataset.path={path}", "dataset.eval_path=", *overrides])
    records = data.load_records(str(path), cfg.dataset.format,
                                dataclasses.asdict(cfg.dataset.columns))
    encoder = data.encoder_for(cfg, tok, records.column_names)
    return data.encode(records, encoder, str(path), None)


# ------------------------------------------------------------------------- loading formats


@pytest.mark.parametrize("ext", [".json", ".jsonl", ".csv", ".parquet"])
@pytest.mark.parametrize(("fmt", "rows"), [("alpaca", ALPACA), ("text", TEXT)])
def test_flat_formats_load_from_every_file_type(tmp_path, tok, ext, fmt, rows):
    path = write(tmp_path / f"d{ext}", rows)
    assert len(data.load_records(str(path), fmt)) == len(rows)
    examples = encoded(tok, path, [f"dataset.format={fmt}"])
    responses = [labelled(tok, labels) for labels in examples["labels"]]
    if fmt == "alpaca":
        expected = [r["output"] + "</s>" for r in rows]
    else:  # every token but the first (bos) is trained
        expected = [r["text"] + "</s>" for r in rows]
    assert responses == expected


@pytest.mark.parametrize("ext", [".json", ".jsonl", ".parquet"])
def test_sharegpt_loads_and_trains_on_every_assistant_turn(tmp_path, tok, ext):
    path = write(tmp_path / f"c{ext}", SHAREGPT)
    first, second = encoded(tok, path, ["dataset.format=sharegpt", "dataset.max_length=128"])[
        "labels"]
    assert labelled(tok, first) == "3</s>4</s>"
    assert labelled(tok, second) == "Hello</s>"


def test_renamed_columns_are_read(tmp_path, tok):
    rows = [{"question": "Add 1 2", "answer": "3"}]
    path = write(tmp_path / "qa.jsonl", rows)
    examples = encoded(tok, path, ["dataset.format=prompt_completion",
                                   "dataset.columns.prompt=question",
                                   "dataset.columns.completion=answer"])
    assert labelled(tok, examples["labels"][0]) == "3</s>"
    assert tok.decode(examples["input_ids"][0]) == "<s>Add 1 23</s>"


# ------------------------------------------------------------------------- errors


def test_missing_field_names_field_file_and_fix(tmp_path):
    path = write(tmp_path / "bad.jsonl", [{"instruction": "x", "answer": "y"}])
    with pytest.raises(DataError) as err:
        data.load_records(str(path), "alpaca")
    message = str(err.value)
    assert "needs column(s) 'output' but" in message and str(path) in message
    assert "dataset.columns.<field>=<column>" in message and "dataset.format" in message


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

    def no_hub(dataset_id: str, where: object) -> None:
        raise DataError(f"hub asked for {dataset_id}")

    monkeypatch.setattr(data, "load_hub", no_hub)
    with pytest.raises(DataError, match="hub asked for tatsu-lab/alpaca"):
        data.load_records("tatsu-lab/alpaca", "alpaca")
    with pytest.raises(DataError, match="not found"):  # a file name is never a hub id
        data.load_records("data/sharegpt.jsonl", "sharegpt")



# ------------------------------------------------------------------------- collator


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
    return [r["instruction"] for r in train], [r["instruction"] for r in evaluation]


def test_held_out_split_is_disjoint_deterministic_and_seeded():
    train, evaluation = held_out(seed=7)
    assert len(evaluation) == 790 and len(train) == 7110
    assert not set(train) & set(evaluation)
    assert held_out(seed=7) == (train, evaluation)
    assert held_out(seed=8)[1] != evaluation


def test_zero_eval_fraction_gives_no_eval():
    cfg = compose_config(["dataset.eval_path=", "dataset.eval_fraction=0"])
    assert data.split_records(cfg)[1] is None


def test_encode_splits_on_the_default(tok):
    train, evaluation = data.encode_splits(compose_config([]), tok, progress=False)
    assert (len(train), len(evaluation)) == (7900, 200)
    assert set(train.column_names) == {"input_ids", "labels"}
    first = train[0]
    assert tok.decode(first["input_ids"]).startswith("<s>### Human:\n")
    assert labelled(tok, first["labels"]).endswith("</s>")


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
    examples = encoded(tok, BUNDLED / f"{split}.jsonl", ["dataset.max_length=256"])
    lengths = [len(ids) for ids in examples["input_ids"]]
    assert len(lengths) == {"train": 7900, "eval": 200}[split]
    assert max(lengths) <= 32 <= compose_config([]).dataset.max_length


def bundled_rows(split: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (BUNDLED / f"{split}.jsonl").read_text().splitlines()]


def test_bundled_eval_is_disjoint_from_train():
    def prompts(split: str) -> set:
        return {row["instruction"] for row in bundled_rows(split)}

    assert len(prompts("train")) == 7900 and len(prompts("eval")) == 200
    assert not prompts("train") & prompts("eval")


def test_bundled_rows_are_two_digit_sums_in_one_format():
    """The user turn is the sum alone (no `input`), so `ftl chat --prompt "12+30"` asks
    what training asked; every pair of 10..99 appears once across the two files."""
    rows = bundled_rows("train") + bundled_rows("eval")
    pairs = set()
    for row in rows:
        assert set(row) == {"instruction", "output"}, row
        a, b = row["instruction"].split("+")
        assert len(a) == len(b) == 2 and row["output"] == str(int(a) + int(b)), row
        pairs.add((int(a), int(b)))
    assert pairs == {(a, b) for a in range(10, 100) for b in range(10, 100)}
    assert {"instruction": "12+30", "output": "42"} in bundled_rows("eval")  # the README's


def test_generator_reproduces_the_committed_files(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_data.py"),
         "--data-dir", str(tmp_path / "data"), "--tokenizer-dir", str(tmp_path / "tok"),
         "--mix-dir", str(tmp_path / "mix")],
        check=True, capture_output=True,
    )
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / "data" / name).read_bytes() == (BUNDLED / name).read_bytes(), name
    for name in ("sub.jsonl", "chat.jsonl"):
        assert (tmp_path / "mix" / name).read_bytes() == (ROOT / "data" / "mix" / name
                                                          ).read_bytes(), name
    for path in sorted(TOKENIZER_DIR.iterdir()):
        assert (tmp_path / "tok" / path.name).read_bytes() == path.read_bytes(), path.name
