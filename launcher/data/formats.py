"""What one data row means, per `dataset.format`: a conversation, raw text pieces or a
preference pair (each format's row and what is trained: the table in docs/guide.md "Data");
`dataset.columns` renames the fields, e.g. `dataset.columns.messages=conversation`.
Pure and light (no `datasets`, no tokenizer): datascan.py and encode.py apply its rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

FIELDS: dict[str, dict[str, bool]] = {
    "chat": {"messages": True},
    "sharegpt": {"messages": True},
    "alpaca": {"instruction": True, "input": False, "output": True, "system": False},
    "prompt_completion": {"prompt": True, "completion": True},
    "text": {"text": True},
    "preference": {"prompt": False, "chosen": True, "rejected": True},
}
"""format -> {field: required}. A field's column is the field's name unless renamed."""
FORMATS = tuple(FIELDS)
CHAT_FORMATS = ("chat", "sharegpt", "alpaca")
"""Formats whose row is one conversation rendered through a chat template (SFT)."""
PREFERENCE = "preference"
"""A prompt and two answers to it, the chosen and the rejected one (objective=dpo)."""
TEMPLATE_FORMATS = (*CHAT_FORMATS, PREFERENCE)
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

Messages = list[dict[str, str]]
"""Turns as [{"role", "content"}], roles as the chat template names them."""

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
        elif fmt == PREFERENCE:
            pair_of(row, columns)
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


# ---------------------------------------------------------------------------- preference


class Pair(NamedTuple):
    """A preference row as turns: the prompt (with at least one user turn) and the two
    answers that follow it (each starting and ending with an assistant turn)."""

    prompt: Messages
    chosen: Messages
    rejected: Messages


def pair_of(row: Mapping[str, Any], columns: Mapping[str, str]) -> Pair:
    """A preference row in either form, as turns.

    Text: `{"prompt": str, "chosen": str, "rejected": str}`; the prompt is one user turn,
    each answer one assistant turn. The prompt is required here: between two texts there
    is no telling where a prompt would end.
    Conversational: chosen and rejected are lists of turns (role/content or from/value, as
    in the chat format) ending with an assistant turn; the prompt is a list of turns, a
    text (one user turn), or absent: then it is the longest run of opening turns chosen and
    rejected share, and each answer is what follows. Answers that repeat an explicit
    prompt's turns at their start (UltraFeedback's layout) have them taken off."""
    chosen, chosen_is_text = _answer_turns(row, columns, "chosen")
    rejected, rejected_is_text = _answer_turns(row, columns, "rejected")
    if chosen == rejected:
        raise RowError(f"fields {columns['chosen']!r} and {columns['rejected']!r} hold the same "
                       "answer: a pair must differ to say which answer is preferred")
    prompt_column = columns["prompt"]
    given = row.get(prompt_column)
    if given is None or given == "" or given == []:
        if chosen_is_text or rejected_is_text:
            state = "missing" if prompt_column not in row else "empty"
            raise RowError(
                f"field {prompt_column!r} is {state}: with a text answer the prompt must be "
                "given (only two lists of turns imply one: the opening turns they share)")
        prompt = chosen[:common_prefix(chosen, rejected)]
    elif isinstance(given, list):
        prompt = _turns_of(given, prompt_column)
    elif isinstance(given, Mapping):
        raise RowError(_not_text_or_turns(prompt_column))
    else:
        prompt = [{"role": "user", "content": given if isinstance(given, str) else str(given)}]
    shared = len(prompt)
    if chosen[:shared] == prompt and rejected[:shared] == prompt:
        chosen, rejected = chosen[shared:], rejected[shared:]
    if not any(turn["role"] == "user" for turn in prompt):
        source = (f"field {prompt_column!r}" if prompt_column in row and given not in ("", [])
                  else "the opening turns chosen and rejected share, as no prompt is given")
        raise RowError(f"the prompt ({source}) has no user turn: there is nothing the "
                       "answers reply to")
    for column, answer in ((columns["chosen"], chosen), (columns["rejected"], rejected)):
        _check_answer(column, answer)
    return Pair(prompt, chosen, rejected)


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items a and b share (turns here; token ids in encode.py)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _answer_turns(
    row: Mapping[str, Any], columns: Mapping[str, str], field: str
) -> tuple[Messages, bool]:
    """(the answer's turns, whether it was given as text)."""
    column = columns[field]
    value = row.get(column)
    if isinstance(value, list):
        if not value:
            raise RowError(f"field {column!r} is an empty list of turns")
        return _turns_of(value, column), False
    if isinstance(value, Mapping):
        raise RowError(_not_text_or_turns(column))
    return [{"role": "assistant", "content": _field(row, columns, field)}], True


def _turns_of(turns: list[Any], column: str) -> Messages:
    try:
        return [_turn(turn, index) for index, turn in enumerate(turns)]
    except RowError as error:
        raise RowError(f"field {column!r}: {error}") from None


def _check_answer(column: str, answer: Messages) -> None:
    if not answer:
        raise RowError(f"field {column!r} has no turn after the prompt (when no prompt is "
                       "given, the turns it shares with the other answer): no answer to "
                       "compare")
    for where, turn in (("starts", answer[0]), ("ends", answer[-1])):
        if turn["role"] != "assistant":
            raise RowError(f"field {column!r}: the answer {where} with a {turn['role']} turn; "
                           "an answer is the assistant's reply to the prompt, so it starts "
                           "and ends with an assistant turn")


def _not_text_or_turns(column: str) -> str:
    return (f"field {column!r} is one object; it must be text or a list of turns "
            "([{role, content}, ...])")
