"""The streaming data scan: every bad row is named by file and line (or element, or row)
with what is wrong and the fix, before anything launches, without loading the file."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from launcher.data.datascan import Scan, scan_file
from launcher.errors import ConfigError
from launcher.run.launch import check

CHAT = {"messages": [{"role": "user", "content": "2+2?"},
                     {"role": "assistant", "content": "4"}]}
SHAREGPT = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
ALPACA = {"instruction": "Add.", "input": "2 2", "output": "4"}
PROMPT_COMPLETION = {"prompt": "2+2=", "completion": "4"}
TEXT = {"text": "Once upon a time."}
GOOD = {"chat": CHAT, "sharegpt": SHAREGPT, "alpaca": ALPACA,
        "prompt_completion": PROMPT_COMPLETION, "text": TEXT}
FLAT = {"alpaca": ALPACA, "prompt_completion": PROMPT_COMPLETION, "text": TEXT}
"""Formats whose rows fit in CSV cells."""


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_csv(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8", newline="")
    return path


def scan(path: Path, fmt: str, renames: Mapping[str, str] | None = None,
         limit: int = 10) -> Scan:
    return scan_file(path, fmt, renames or {}, limit)


def only_problem(path: Path, fmt: str, renames: Mapping[str, str] | None = None) -> str:
    problems = scan(path, fmt, renames).problems
    assert len(problems) == 1, problems
    assert "Fix:" in problems[0], problems[0]
    return problems[0]


# ---------------------------------------------------------------------------- good files


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_good_jsonl_scans_clean_with_every_row_counted(tmp_path: Path, fmt: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD[fmt]] * 7)
    assert scan(path, fmt) == Scan(rows=7, problems=[])


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_good_json_array_scans_clean(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "d.json"
    path.write_text("\n  " + json.dumps([GOOD[fmt]] * 4, indent=2))
    assert scan(path, fmt) == Scan(rows=4, problems=[])


def test_json_file_of_json_lines_is_read_as_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.json", [ALPACA, ALPACA, {"instruction": "x"}])
    problems = scan(path, "alpaca").problems
    assert len(problems) == 1 and problems[0].startswith(f"{path}:3: field 'output'")


@pytest.mark.parametrize("fmt", sorted(FLAT))
def test_good_csv_scans_clean(tmp_path: Path, fmt: str) -> None:
    row = FLAT[fmt]
    text = ",".join(row) + "\r\n" + ",".join(row.values()) + "\r\n\r\n"
    path = write_csv(tmp_path / "d.csv", text + ",".join(row.values()) + "\r\n")
    assert scan(path, fmt) == Scan(rows=2, problems=[])


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_good_parquet_scans_clean_across_batches(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD[fmt]] * 2500), path, row_group_size=1000)
    assert scan(path, fmt) == Scan(rows=2500, problems=[])


def test_chat_file_with_conversations_column_is_read(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [SHAREGPT] * 3)
    assert scan(path, "chat") == Scan(rows=3, problems=[])


def test_renamed_columns_are_used(tmp_path: Path) -> None:
    chat = write_jsonl(tmp_path / "c.jsonl", [{"conversation": CHAT["messages"]}] * 2)
    assert scan(chat, "chat", {"messages": "conversation", "text": ""}) == Scan(2, [])
    assert "field 'messages'" in scan(chat, "chat").problems[0]
    qa = write_csv(tmp_path / "qa.csv", "question,answer\n2+2=,4\n")
    renames = {"prompt": "question", "completion": "answer"}
    assert scan(qa, "prompt_completion", renames) == Scan(1, [])
    assert "no column 'prompt', 'completion'" in only_problem(qa, "prompt_completion")


def test_unsupported_extension_and_format_are_left_to_other_rules(tmp_path: Path) -> None:
    path = tmp_path / "d.txt"
    path.write_text("not json\n")
    assert scan(path, "text") == Scan(0, [])
    assert scan(write_jsonl(tmp_path / "d.jsonl", ["x"]), "nope") == Scan(0, [])


# ---------------------------------------------------------------------------- JSON problems


def test_malformed_json_names_file_line_and_json_message(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ALPACA) + "\n\n" + '{"instruction": "x" "output": "y"}\n')
    message = only_problem(path, "alpaca")
    assert message.startswith(f"{path}:3: not valid JSON (Expecting ',' delimiter)")
    assert "correct or remove line 3" in message


def test_json_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [TEXT, TEXT, ["a", "list"], "text"])
    first, second = scan(path, "text").problems
    assert first.startswith(f"{path}:3: is an array, not an object")
    assert second.startswith(f"{path}:4: is a string, not an object")


@pytest.mark.parametrize("row, state", [({"instruction": "x"}, "missing"),
                                        ({"instruction": "x", "output": ""}, "empty")])
def test_missing_or_empty_field_names_line_field_and_columns(
    tmp_path: Path, row: dict[str, str], state: str
) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [ALPACA, row])
    message = only_problem(path, "alpaca")
    assert message.startswith(f"{path}:2: field 'output' is {state} (the row has ['instruction'")
    assert ("dataset.columns.output=NAME" in message) == (state == "missing")


@pytest.mark.parametrize("messages, says", [
    ([{"role": "robot", "content": "x"}], "turn 0 has role 'robot'"),
    ([{"role": "user", "content": "x"}], "no assistant turn"),
    ("hello", "field 'messages' must be a non-empty list of turns"),
])
def test_bad_conversations_are_named_by_line(tmp_path: Path, messages: Any, says: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [CHAT, CHAT, {"messages": messages}])
    message = only_problem(path, "chat")
    assert message.startswith(f"{path}:3: ") and says in message


def test_bad_json_array_element_is_named_by_index(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([SHAREGPT, {"conversations": [{"from": "gpt"}]}], indent=1))
    message = only_problem(path, "sharegpt")
    assert message.startswith(f"{path}: element 2: turn 0 needs role and content")


def test_malformed_json_array_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b"\n]\n')
    assert only_problem(path, "text").startswith(f"{path}:4: not valid JSON")


@pytest.mark.parametrize("name, content", [("d.jsonl", ""), ("d.jsonl", " \n\n\t\n"),
                                           ("d.json", "\n"), ("d.csv", "\n\n"),
                                           ("d.parquet", "")])
def test_empty_file_is_named(tmp_path: Path, name: str, content: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    assert only_problem(path, "text").startswith(f"{path}: the file is empty.")


def test_file_without_rows_is_named(tmp_path: Path) -> None:
    array = tmp_path / "d.json"
    array.write_text("[]")
    assert only_problem(array, "text").startswith(f"{array}: has no data rows")
    header = write_csv(tmp_path / "d.csv", "text\n")
    assert only_problem(header, "text").startswith(f"{header}: has no data rows")


def test_non_utf8_line_names_line_and_byte_offset(tmp_path: Path) -> None:
    first = (json.dumps(TEXT) + "\n").encode()
    path = tmp_path / "d.jsonl"
    path.write_bytes(first + b'\n{"text": "caf\xe9"}\n' + first)
    message = only_problem(path, "text")
    offset = len(first) + 1 + len(b'{"text": "caf')
    assert message.startswith(f"{path}:3: not UTF-8 (byte 0xe9 at byte offset {offset} ")
    assert "re-encode the file as UTF-8" in message
    assert scan(path, "text").rows == 2


def test_non_utf8_csv_names_line(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(b"text\nfine\ncaf\xe9\n")
    message = only_problem(path, "text")
    assert message.startswith(f"{path}:3: not UTF-8 (byte 0xe9 at byte offset 13 ")


# ---------------------------------------------------------------------------- CSV, parquet


def test_csv_missing_columns_is_one_problem_listing_the_header(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", "instruction,input\n" + "a,b\n" * 50)
    message = only_problem(path, "alpaca")
    assert message.startswith(f"{path}: no column 'output' for dataset.format=alpaca")
    assert "the columns are 'instruction', 'input'" in message
    assert "dataset.columns.output=NAME" in message


def test_csv_bad_row_names_its_first_line(tmp_path: Path) -> None:
    text = 'instruction,output\n"two\nlines",ok\n\nx,\ny,z,extra\n'
    path = write_csv(tmp_path / "d.csv", text)
    empty, extra = scan(path, "alpaca").problems
    assert empty.startswith(f"{path}:5: field 'output' is empty")
    assert extra.startswith(f"{path}:6: has 3 values, the header has 2 columns")


def test_parquet_missing_columns_and_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    rows = [PROMPT_COMPLETION] * 1500 + [{"prompt": "x", "completion": ""}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    message = only_problem(path, "prompt_completion")
    assert message.startswith(f"{path}: row 1501: field 'completion' is empty")
    missing = only_problem(path, "text")
    assert missing.startswith(f"{path}: no column 'text'")
    assert "the columns are 'prompt', 'completion'" in missing


def test_not_a_parquet_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_text("text\nhello\n")
    assert only_problem(path, "text").startswith(f"{path}: not a readable parquet file")


# ---------------------------------------------------------------------------- limit, memory


def test_scan_stops_after_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("oops\n" * 30)
    problems = scan(path, "text", limit=3).problems
    assert [p.split(": ")[0] for p in problems[:3]] == [f"{path}:{n}" for n in (1, 2, 3)]
    assert problems[3:] == [f"{path}: more problems not listed (stopped after 3)"]
    assert len(scan(path, "text").problems) == 11
    exactly = tmp_path / "e.jsonl"
    exactly.write_text("oops\n" * 3)
    assert len(scan(exactly, "text", limit=3).problems) == 3


def test_scan_streams_a_large_file_in_little_memory(tmp_path: Path) -> None:
    # 9 MB, twice the bound even as one string, 100+ MB as objects; every row is a chat
    # row, so the scan is all the time there is (under tracemalloc, ~3x slower)
    rows = 100_000
    path = tmp_path / "big.jsonl"
    path.write_text((json.dumps(CHAT) + "\n") * rows)
    tracemalloc.start()
    try:
        result = scan(path, "chat")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result == Scan(rows=rows, problems=[])
    assert peak < 4 * 1024**2, f"peak {peak / 1024**2:.1f} MiB"


# ---------------------------------------------------------------------------- end to end


def bad_alpaca_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ALPACA) + "\n" + json.dumps(ALPACA) + "\n"
                    + '{"instruction": "x", "output": \n')
    return path


def test_check_for_train_fails_on_a_bad_line(tmp_path: Path) -> None:
    base = ["dataset.eval_path=", "dataset.eval_fraction=0.1", "train.eval_on_start=false",
            f"run.output_dir={tmp_path / 'out'}"]
    good = write_jsonl(tmp_path / "good.jsonl", [ALPACA] * 20)
    check([f"dataset.path={good}", *base], "train")  # the bad file below is the only change
    bad = bad_alpaca_file(tmp_path)
    with pytest.raises(ConfigError) as caught:
        check([f"dataset.path={bad}", *base], "train")
    (problem,) = caught.value.problems
    assert problem.startswith(f"dataset.path={bad}: {bad}:3: not valid JSON")


def test_ftl_train_exits_2_on_a_bad_line_and_writes_no_run_dir(tmp_path: Path) -> None:
    bad, out = bad_alpaca_file(tmp_path), tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "train", f"dataset.path={bad}", "dataset.eval_path=",
         "dataset.eval_fraction=0.1", "train.eval_on_start=false", f"run.output_dir={out}"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{bad}:3: not valid JSON" in done.stderr
    assert not out.exists() or not any(out.iterdir())
