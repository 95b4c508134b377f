"""What one data row means, per `dataset.format`: a conversation or raw text pieces (each
format's row and what is trained: the table in docs/guide.md "Data"); `dataset.columns` renames the
fields, e.g. `dataset.columns.messages=conversation`.
Pure and light (no `datasets`, no tokenizer): datascan.py and encode.py apply its rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FIELDS: dict[str, dict[str, bool]] = {
    "chat": {"messages": True},
    "sharegpt": {"messages": True},
    "alpaca": {"instruction": True, "input": False, "output": True, "system": False},
    "prompt_completion": {"prompt": True, "completion": True},
    "text": {"text": True},
}
"""format -> {field: required}. A field's column is the field's name unless renamed."""
FORMATS = tuple(FIELDS)
CHAT_FORMATS = ("chat", "sharegpt", "alpaca")
"""Formats rendered through a chat template; the others are tokenized as plain text pieces."""

DEFAULT_COLUMNS: dict[str, dict[str, str]] = {"sharegpt": {"messages": "conversations"}}
CHAT_COLUMN_FALLBACK = "conversations"
"""A chat file without a `messages` column may keep its turns in `conversations`."""

ROLES: dict[str, str] = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
}
"""Role names accepted in a turn -> the chat-template role (ShareGPT's human/gpt)."""

Segment = tuple[str, bool]
"""A piece of raw text and whether it is trained on."""


class RowError(ValueError):
    """What is wrong with one row (the caller adds the file, line or row number)."""


def column_map(
    fmt: str, renames: Mapping[str, str], available: Sequence[str] | None = None
) -> dict[str, str]:
    """field -> column for `fmt`: defaults, then `dataset.columns` renames. With the
    file's columns known, a chat file's `conversations` stands in for a missing `messages`."""
    columns = {name: name for name in FIELDS[fmt]}
    columns.update(DEFAULT_COLUMNS.get(fmt, {}))
    columns.update({field: str(col) for field, col in renames.items()
                    if field in columns and col})
    if (fmt == "chat" and not renames.get("messages") and available is not None
            and "messages" not in available and CHAT_COLUMN_FALLBACK in available):
        columns["messages"] = CHAT_COLUMN_FALLBACK
    return columns


def unknown_renames(fmt: str, renames: Mapping[str, str]) -> list[str]:
    """dataset.columns fields set that `fmt` does not have."""
    return [field for field, col in renames.items() if col and field not in FIELDS[fmt]]


def missing_columns(fmt: str, columns: Mapping[str, str], available: Sequence[str]) -> list[str]:
    """Required columns (as the user names them) absent from the data."""
    return [col for field, col in columns.items()
            if FIELDS[fmt][field] and col not in available]


def row_problem(row: Mapping[str, Any], fmt: str, columns: Mapping[str, str]) -> str | None:
    """None when the row is usable, else what is wrong with it."""
    try:
        if fmt in CHAT_FORMATS:
            messages_of(row, fmt, columns)
        else:
            segments_of(row, fmt, columns)
    except RowError as error:
        return str(error)
    return None


def messages_of(
    row: Mapping[str, Any], fmt: str, columns: Mapping[str, str]
) -> list[dict[str, str]]:
    """The conversation of a chat, sharegpt or alpaca row as [{"role", "content"}]."""
    if fmt == "alpaca":
        return _alpaca_messages(row, columns)
    column = columns["messages"]
    turns = row.get(column)
    if not isinstance(turns, list) or not turns:
        found = type(turns).__name__ if column in row else "no such field"
        raise RowError(f"field {column!r} must be a non-empty list of turns "
                       f"({{role, content}} or {{from, value}}), got {found}")
    messages = [_turn(turn, index) for index, turn in enumerate(turns)]
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError(f"field {column!r}: the conversation has no assistant turn to train on")
    return messages


def _turn(turn: Any, index: int) -> dict[str, str]:
    if not isinstance(turn, Mapping):
        raise RowError(f"turn {index} is a {type(turn).__name__}, not a {{role, content}} object")
    role = turn.get("role", turn.get("from"))
    content = turn.get("content", turn.get("value"))
    if role is None or content is None:
        raise RowError(f"turn {index} needs role and content (or from and value); "
                       f"it has {sorted(turn)}")
    if str(role) not in ROLES:
        raise RowError(f"turn {index} has role {role!r}; use one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise RowError(f"turn {index}: content must be text, got {type(content).__name__}")
    return {"role": ROLES[str(role)], "content": content}


def _alpaca_messages(row: Mapping[str, Any], columns: Mapping[str, str]) -> list[dict[str, str]]:
    instruction = _field(row, columns, "instruction")
    extra = _field(row, columns, "input", required=False)
    system = _field(row, columns, "system", required=False)
    user = f"{instruction}\n\n{extra}" if extra else instruction
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": user},
            {"role": "assistant", "content": _field(row, columns, "output")}]


def segments_of(row: Mapping[str, Any], fmt: str, columns: Mapping[str, str]) -> list[Segment]:
    """The raw text pieces of a prompt_completion or text row (no bos/eos yet)."""
    if fmt == "text":
        return [(_field(row, columns, "text"), True)]
    return [(_field(row, columns, "prompt"), False), (_field(row, columns, "completion"), True)]


def _field(
    row: Mapping[str, Any], columns: Mapping[str, str], field: str, required: bool = True
) -> str:
    column = columns[field]
    value = row.get(column)
    # CSV and parquet cells may come back as numbers (an output "68" read as int 68).
    text = "" if value is None else value if isinstance(value, str) else str(value)
    if required and not text:
        state = "missing" if column not in row else "empty"
        raise RowError(f"field {column!r} is {state} (the row has {sorted(row)})")
    return text
