"""Check a local training data file row by row before anything launches: a bad line in a
million-row file fails `ftl train` in seconds, naming the file and the line, not minutes
later inside a rank. So the scan streams (JSON Lines and CSV a line at a time, parquet a
record batch at a time; a .json array has to be parsed whole) and keeps no checked row.

Each row is checked with `formats.row_problem`, the encoder's rule. The scan stops after
`limit` problems: ten bad rows show the pattern, a million would bury it.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from launcher.data import formats

_decode_json = json.JSONDecoder().decode
"""json.loads without its per-call checks: it runs once per line of a million-line file."""
PARQUET_BATCH_ROWS = 1024
"""Rows per parquet record batch: bounded memory, few Python round trips."""
CSV_FIELD_LIMIT = 2**31 - 1
"""csv's cap on one cell, raised from 128 KiB while scanning (see _read_csv)."""
JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number",
              float: "a number", bool: "a boolean", type(None): "null"}


@dataclass(frozen=True)
class Scan:
    """What a scan saw: data rows checked, and the problems (at most `limit`, plus a line
    saying that more were left out)."""

    rows: int
    problems: list[str]


class _Row(NamedTuple):
    """One parsed row: `unit` is line, element or row, `number` counts from 1. A tuple, and
    its location worded only when it has a problem: the scan makes one per row."""

    path: Path
    unit: str
    number: int
    value: Any

    @property
    def where(self) -> str:
        """The problem's prefix: `FILE:17`, `FILE: element 3`, `FILE: row 5`."""
        if self.unit == "line":
            return f"{self.path}:{self.number}"
        return f"{self.path}: {self.unit} {self.number}"

    @property
    def name(self) -> str:
        """The row in the fix: `line 17`, `element 3 of the array`, `row 5`."""
        suffix = " of the array" if self.unit == "element" else ""
        return f"{self.unit} {self.number}{suffix}"


_Item = _Row | str
"""A row, or a problem found while reading it (not JSON, not UTF-8, no header), worded. A
reader stops after a problem nothing after it can be read past."""


@dataclass
class _Checker:
    """Checks rows against the format; the column map is fixed by the first row's keys (JSON)
    or the header (CSV, parquet), so a chat file with `conversations` works."""

    path: Path
    fmt: str
    renames: Mapping[str, str]
    columns: dict[str, str] | None = None

    def missing_header(self, available: Sequence[str]) -> str | None:
        """Required columns absent from a CSV or parquet header: one problem for the file."""
        self.columns = formats.column_map(self.fmt, self.renames, list(available))
        missing = formats.missing_columns(self.fmt, self.columns, list(available))
        if not missing:
            return None
        return (f"{self.path}: no column {', '.join(map(repr, missing))} for dataset.format="
                f"{self.fmt} (the columns are {', '.join(map(repr, available)) or 'none'}). "
                f"Fix: add the column, or name the column that holds it with "
                f"{self._renames(missing)}.")

    def problem(self, row: _Row) -> str | None:
        value = row.value
        if not isinstance(value, dict):
            kind = JSON_TYPES.get(type(value), type(value).__name__)
            return (f"{row.where}: is {kind}, not an object. Fix: make {row.name} one "
                    "{...} object with the fields of the format, or remove it.")
        if self.columns is None:
            self.columns = formats.column_map(self.fmt, self.renames, list(value))
        problem = formats.row_problem(value, self.fmt, self.columns)
        if problem is None:
            return None
        # A required column absent from the row is more often a naming mismatch than bad data.
        missing = formats.missing_columns(self.fmt, self.columns, list(value))
        hint = (f", or if the data names it differently set {self._renames(missing)}"
                if missing else "")
        return f"{row.where}: {problem}. Fix: correct or remove {row.name}{hint}."

    def _renames(self, missing: Sequence[str]) -> str:
        assert self.columns is not None
        return " ".join(f"dataset.columns.{name}=NAME" for name, col in self.columns.items()
                        if col in missing)


def scan_file(path: Path, fmt: str, renames: Mapping[str, str], limit: int = 10) -> Scan:
    """Check every row of a local .jsonl/.json/.csv/.parquet file for `fmt` (a key of
    formats.FIELDS), with `renames` as in dataset.columns ("" = not renamed). Other
    extensions and formats give no problems: other rules report those."""
    read = _READERS.get(path.suffix.lower())
    if read is None or fmt not in formats.FORMATS:
        return Scan(rows=0, problems=[])
    checker, rows, problems = _Checker(path, fmt, renames), 0, []
    try:
        for item in read(path, checker):
            if isinstance(item, _Row):
                rows += 1
            problem = checker.problem(item) if isinstance(item, _Row) else item
            if problem is not None:
                problems.append(problem)
            if len(problems) > limit:
                break
    except OSError as error:
        problems.append(f"{path}: cannot be read ({error.strerror or error}). Fix: check the "
                        "path and its permissions.")
    if rows == 0 and not problems:
        problems.append(f"{path}: has no data rows. Fix: point the setting at the data file, "
                        "or add rows to it.")
    if len(problems) > limit:
        problems[limit:] = [f"{path}: more problems not listed (stopped after {limit})"]
    return Scan(rows=rows, problems=problems)


# ---------------------------------------------------------------------------- JSON


def _read_json(path: Path, checker: _Checker) -> Iterator[_Item]:
    """JSON Lines; a .json file that starts with `[` is one JSON array."""
    first = _first_char(path)
    if first == b"":
        yield _empty(path)
    elif first == b"[" and path.suffix.lower() == ".json":
        yield from _read_json_array(path)
    else:
        yield from (_json_line(path, number, raw, start)
                    for number, raw, start in _lines(path) if not raw.isspace())


def _json_line(path: Path, number: int, raw: bytes, start: int) -> _Item:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return _not_utf8(path, number, raw[error.start], start + error.start)
    try:
        value = _decode_json(text)
    except json.JSONDecodeError as error:
        return _not_json(path, number, error.msg, f"line {number}")
    return _Row(path, "line", number, value)


def _read_json_array(path: Path) -> Iterator[_Item]:
    # One JSON array has no row boundaries to stream on: json needs the whole text. Files that
    # big should be JSON Lines, which is what the fix of a bad element says anyway.
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        yield _not_utf8(path, line, data[error.start], error.start)
        return
    del data
    try:
        elements = json.loads(text)
    except json.JSONDecodeError as error:
        yield _not_json(path, error.lineno, error.msg, f"the JSON at line {error.lineno} "
                        f"column {error.colno}")
        return
    for index, value in enumerate(elements, start=1):
        yield _Row(path, "element", index, value)


def _first_char(path: Path) -> bytes:
    """The first non-whitespace byte, b"" for an empty file; reads only as far as needed."""
    with path.open("rb") as handle:
        while block := handle.read(1 << 16):
            stripped = block.lstrip(b" \t\r\n")  # JSON's whitespace
            if stripped:
                return stripped[:1]
    return b""


# ---------------------------------------------------------------------------- CSV


def _read_csv(path: Path, checker: _Checker) -> Iterator[_Item]:
    # Long text cells (continued pre-training) pass csv's default 128 KiB field limit, which
    # pandas, the loader the ranks use, does not have.
    old_limit = csv.field_size_limit(CSV_FIELD_LIMIT)
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            # csv.reader, not DictReader: it yields a blank line as [], so every record's
            # first line is known (DictReader skips blanks silently; a record may span lines).
            reader = csv.reader(handle)
            try:
                yield from _csv_records(path, checker, reader)
            except csv.Error as error:
                yield (f"{path}:{reader.line_num}: not valid CSV ({error}). Fix: correct the "
                       "line; quote fields that hold commas, quotes or line breaks.")
    except UnicodeDecodeError:
        # The text layer decodes in blocks, so its error has no line: find it in bytes.
        yield _first_non_utf8_line(path)
    finally:
        csv.field_size_limit(old_limit)


def _csv_records(path: Path, checker: _Checker, reader: Any) -> Iterator[_Item]:
    header = next((values for values in reader if values), None)
    if header is None or not any(name.strip() for name in header):
        yield _empty(path)
        return
    if (problem := checker.missing_header(header)) is not None:
        yield problem
        return
    line = reader.line_num
    for values in reader:
        first, line = line + 1, reader.line_num
        if len(values) > len(header):
            yield (f"{path}:{first}: has {len(values)} values, the header has {len(header)} "
                   f"columns. Fix: quote the values that hold commas, or correct or remove "
                   f"line {first}.")
        elif values:
            yield _Row(path, "line", first, dict(zip(header, values, strict=False)))


# ---------------------------------------------------------------------------- parquet


def _read_parquet(path: Path, checker: _Checker) -> Iterator[_Item]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.stat().st_size == 0:
        yield _empty(path)
        return
    try:
        parquet = pq.ParquetFile(path)
        if (problem := checker.missing_header(parquet.schema_arrow.names)) is not None:
            yield problem
            return
        batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS)
        values = (value for batch in batches for value in batch.to_pylist())
        for number, value in enumerate(values, start=1):
            yield _Row(path, "row", number, value)
    except (pa.ArrowException, OSError) as error:
        yield (f"{path}: not a readable parquet file ({error}). Fix: rewrite it, e.g. with "
               "pandas' to_parquet, or use JSON Lines.")


# ---------------------------------------------------------------------------- problems


def _empty(path: Path) -> str:
    return (f"{path}: the file is empty. Fix: point the setting at the data file, or write "
            "the rows into it.")


def _not_json(path: Path, line: int, message: str, what: str) -> str:
    return (f"{path}:{line}: not valid JSON ({message}). Fix: correct or remove {what}; a "
            "JSON Lines file holds one {...} object per line.")


def _not_utf8(path: Path, line: int, byte: int, offset: int) -> str:
    return (f"{path}:{line}: not UTF-8 (byte 0x{byte:02x} at byte offset {offset} of the "
            f"file). Fix: re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 {path} "
            f"> fixed{path.suffix}`.")


def _lines(path: Path) -> Iterator[tuple[int, bytes, int]]:
    """(number from 1, line, its byte offset): binary lines, decoded one by one by the
    caller, so a stray latin-1 byte is named by line and offset."""
    offset = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            yield number, raw, offset
            offset += len(raw)


def _first_non_utf8_line(path: Path) -> str:
    for number, raw, start in _lines(path):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as error:
            return _not_utf8(path, number, raw[error.start], start + error.start)
    # A multi-byte character cut by the end of the file.
    return f"{path}: not UTF-8 at its end. Fix: re-encode the file as UTF-8."


_READERS: dict[str, Callable[[Path, _Checker], Iterator[_Item]]] = {
    ".jsonl": _read_json,
    ".json": _read_json,
    ".csv": _read_csv,
    ".parquet": _read_parquet,
}
