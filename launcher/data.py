"""Training data: load records, render a prompt template, tokenize with prompt masking, pack.

Runs only in the worker (and in scripts/make_data.py); `datasets` is imported inside functions.

Formats and their templates. The layout is Alpaca's section headers without its preamble
sentence, so the default tiny model (64-token context) spends few tokens on boilerplate:

  alpaca    {"instruction", "input" (optional), "output"}
            "### Instruction:\\n{instruction}\\n\\n### Input:\\n{input}\\n\\n### Response:\\n"
            + "{output}</s>"          (the Input section is left out when input is empty)
  sharegpt  {"conversations": [{"from": "system"|"human"|"gpt", "value"}, ...]}
            system "### System:\\n{value}\\n\\n", human "### Human:\\n{value}\\n\\n",
            gpt "### Assistant:\\n" + "{value}</s>"   (every assistant turn is a response)
  text      {"text"}                  "{text}</s>"  (every token trains)

Every example starts with the tokenizer's bos token (when it has one). With
`dataset.mask_prompt` the labels are -100 everywhere except the response text and its eos, so
the loss is on what the model should answer. Masking is decided on the tokenization of the
whole text (character offsets), so the ids are exactly those of the joined text.

Without packing an example is truncated to `dataset.max_length`; one whose responses are cut
off entirely has nothing to learn from and is dropped. With `dataset.packing` examples are
concatenated in order and cut into blocks of `max_length` tokens (the last block may be
shorter): nothing is truncated and labels keep their masks, but attention is NOT reset at
example boundaries, so a token can attend to the previous examples in its block.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.compose import PROJECT_ROOT, local_or_as_is
from launcher.errors import ConfigError, DataError

if TYPE_CHECKING:
    from datasets import Dataset

    from launcher.schema import DatasetConfig, RunConfig

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""Label value the HF loss ignores."""

FORMATS: dict[str, tuple[str, ...]] = {
    "alpaca": ("instruction", "output"),
    "sharegpt": ("conversations",),
    "text": ("text",),
}
"""Required fields per format (alpaca's `input` is optional)."""

LOCAL_LOADERS: dict[str, str] = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}
"""File extension -> `datasets` builder."""

ROLE_HEADERS: dict[str, str] = {
    "system": "### System:\n",
    "human": "### Human:\n",
    "user": "### Human:\n",
    "gpt": "### Assistant:\n",
    "assistant": "### Assistant:\n",
}
"""ShareGPT roles (OpenAI's user/assistant accepted as aliases)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

Segment = tuple[str, bool]
"""A piece of rendered text and whether it is trained on (a response) or not (a prompt)."""


# ---------------------------------------------------------------------------- templates


def render(record: Mapping[str, Any], fmt: str, eos: str = "") -> list[Segment]:
    """The template for one record as (text, is_response) pieces; `eos` ends each response."""
    if fmt == "alpaca":
        instruction = _text(record, "instruction")
        extra = _text(record, "input", required=False)
        prompt = f"### Instruction:\n{instruction}\n\n"
        if extra:
            prompt += f"### Input:\n{extra}\n\n"
        return [(prompt + "### Response:\n", False), (_text(record, "output") + eos, True)]
    if fmt == "sharegpt":
        return _render_sharegpt(record.get("conversations"), eos)
    if fmt == "text":
        return [(_text(record, "text") + eos, True)]
    raise ConfigError(
        f"dataset.format={fmt!r} is not a format; use one of {', '.join(FORMATS)}"
    )


def _render_sharegpt(turns: Any, eos: str) -> list[Segment]:
    if not isinstance(turns, list) or not turns:
        raise ValueError("'conversations' must be a non-empty list of {from, value} turns")
    segments: list[Segment] = []
    for turn in turns:
        if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
            raise ValueError(f"each turn needs 'from' and 'value', got {turn!r}")
        role, value = str(turn["from"]), _text(turn, "value")
        if role not in ROLE_HEADERS:
            raise ValueError(f"turn role {role!r} is not one of {', '.join(ROLE_HEADERS)}")
        if ROLE_HEADERS[role].startswith("### Assistant"):
            segments += [(ROLE_HEADERS[role], False), (value + eos, True)]
        else:
            segments.append((f"{ROLE_HEADERS[role]}{value}\n\n", False))
    if not any(is_response for _, is_response in segments):
        raise ValueError("the conversation has no 'gpt' turn to train on")
    return segments


def _text(record: Mapping[str, Any], key: str, required: bool = True) -> str:
    # CSV and parquet columns may come back as numbers (an output "68" read as int 68).
    value = record.get(key)
    if value is None:
        if required:
            raise ValueError(f"field {key!r} is empty")
        return ""
    return value if isinstance(value, str) else str(value)


# ---------------------------------------------------------------------------- loading


def load_records(path: str, fmt: str) -> Dataset:
    """Rows of a local .json/.jsonl/.csv/.parquet file, a local dataset directory or a hub
    dataset id (its train split), checked for the fields `fmt` needs."""
    if fmt not in FORMATS:
        raise ConfigError(
            f"dataset.format={fmt!r} is not a format; use one of {', '.join(FORMATS)}"
        )
    local = Path(local_or_as_is(path))
    if local.is_file():
        records = _load_local(local)
        source = str(local)
    elif local.is_dir() or (local.suffix.lower() not in LOCAL_LOADERS and _HUB_ID.match(path)):
        records = _load_hub(path)
        source = path
    else:
        raise DataError(
            f"dataset file {path} not found (looked in {Path.cwd()} and {PROJECT_ROOT}); "
            "fix dataset.path (a .json/.jsonl/.csv/.parquet file or a hub dataset id)"
        )
    check_fields(records.column_names, fmt, source)
    if len(records) == 0:
        raise DataError(f"{source}: the dataset has no rows; point dataset.path at real data")
    return records


def _load_local(path: Path) -> Dataset:
    from datasets import load_dataset

    builder = LOCAL_LOADERS.get(path.suffix.lower())
    if builder is None:
        raise DataError(
            f"{path}: unsupported file type {path.suffix!r}; convert it to one of "
            f"{', '.join(LOCAL_LOADERS)} and set dataset.path to it"
        )
    # keep_default_na=False: an empty CSV cell (alpaca's optional input) reads as "".
    kwargs: dict[str, Any] = {"keep_default_na": False} if builder == "csv" else {}
    try:
        return load_dataset(builder, data_files=str(path), split="train", **kwargs)
    except Exception as exc:  # datasets raises many types for a malformed file
        raise DataError(f"{path}: cannot be read as {builder}: {exc}") from exc


def _load_hub(dataset_id: str) -> Dataset:
    """A hub dataset (or a local dataset directory) through `datasets.load_dataset`. This
    needs the hub (or its cache); on a machine without one, download the data and point
    dataset.path at the file."""
    from datasets import load_dataset

    try:
        return load_dataset(dataset_id, split="train")
    except Exception as exc:  # network, auth, missing split: all mean the same to the user
        raise DataError(
            f"cannot load dataset {dataset_id!r} ({type(exc).__name__}: {exc}); check the id "
            "and network access, or download it and set dataset.path to a local "
            ".json/.jsonl/.csv/.parquet file"
        ) from exc


def check_fields(columns: Sequence[str], fmt: str, source: str) -> None:
    """DataError naming the missing fields, the file and the fix."""
    missing = [name for name in FORMATS[fmt] if name not in columns]
    if not missing:
        return
    hints = "; ".join(
        f"{name}: {', '.join(fields)}" for name, fields in FORMATS.items() if name != fmt
    )
    raise DataError(
        f"{source}: dataset.format={fmt} needs field(s) {', '.join(map(repr, missing))} but "
        f"the data has {list(columns)}. Rename the field(s) in the file, or set dataset.format "
        f"to the format the data is in ({hints})"
    )


# ---------------------------------------------------------------------------- tokenizing


def tokenize(
    records: Iterable[Mapping[str, Any]],
    fmt: str,
    tokenizer: Any,
    max_length: int | None,
    mask_prompt: bool = True,
    source: str = "dataset",
) -> list[dict[str, list[int]]]:
    """{"input_ids", "labels"} per record: bos + rendered text, labels -100 on the prompt
    (when `mask_prompt`) and on bos, truncated to `max_length` (None: no truncation).
    Records left with no trained token are dropped."""
    eos = tokenizer.eos_token or ""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    examples, dropped = [], 0
    for index, record in enumerate(records):
        try:
            segments = render(record, fmt, eos)
        except ValueError as exc:
            raise DataError(f"{source}: row {index}: {exc}") from exc
        ids, trained = _encode(segments, tokenizer)
        labels = [tok if (train or not mask_prompt) else IGNORE_INDEX
                  for tok, train in zip(ids, trained, strict=True)]
        ids, labels = bos + ids, [IGNORE_INDEX] * len(bos) + labels
        if max_length is not None:
            ids, labels = ids[:max_length], labels[:max_length]
        if all(label == IGNORE_INDEX for label in labels):
            dropped += 1
            continue
        examples.append({"input_ids": ids, "labels": labels})
    if dropped:
        log.warning("%s: dropped %d example(s) with no response token within "
                    "dataset.max_length=%s", source, dropped, max_length)
    if not examples:
        raise DataError(f"{source}: no example has a response token within dataset.max_length="
                        f"{max_length}; raise dataset.max_length")
    return examples


def _encode(segments: list[Segment], tokenizer: Any) -> tuple[list[int], list[bool]]:
    # Tokenize the joined text once (so ids equal a plain tokenization of it) and mark a
    # token as a response token when its first character lies in a response segment.
    text = "".join(piece for piece, _ in segments)
    in_response = [train for piece, train in segments for _ in piece]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    trained = [start < len(text) and in_response[start] for start, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), trained


def pack(examples: Sequence[Mapping[str, list[int]]], max_length: int) -> list[dict]:
    """Concatenate examples in order and cut into `max_length` blocks (last may be shorter).
    Labels keep their masks; attention is not reset at example boundaries."""
    ids = [tok for example in examples for tok in example["input_ids"]]
    labels = [label for example in examples for label in example["labels"]]
    return [
        {"input_ids": ids[start:start + max_length], "labels": labels[start:start + max_length]}
        for start in range(0, len(ids), max_length)
    ]


def prepare(records: Dataset, dataset: DatasetConfig, tokenizer: Any, source: str) -> Dataset:
    """Tokenized (and, with `dataset.packing`, packed) training examples of `records`."""
    from datasets import Dataset

    # Packing keeps every token (long examples continue in the next block), so no truncation.
    limit = None if dataset.packing else dataset.max_length
    examples = tokenize(records, dataset.format, tokenizer, limit, dataset.mask_prompt, source)
    if dataset.packing:
        examples = pack(examples, dataset.max_length)
    return Dataset.from_list(examples)


# ---------------------------------------------------------------------------- entry points


def split_records(cfg: RunConfig) -> tuple[Dataset, Dataset | None, str]:
    """Train and eval records: `dataset.eval_path`, else `dataset.eval_fraction` of
    `dataset.path` held out with seed `train.seed` (None when the fraction is 0)."""
    data = cfg.dataset
    records = load_records(data.path, data.format)
    if data.eval_path:
        return records, load_records(data.eval_path, data.format), data.path
    if data.eval_fraction <= 0:
        return records, None, data.path
    if len(records) < 2 or not 0 < data.eval_fraction < 1:
        raise DataError(
            f"{data.path}: cannot hold out dataset.eval_fraction={data.eval_fraction} of "
            f"{len(records)} row(s); use a fraction between 0 and 1 on more data, "
            "or set dataset.eval_path"
        )
    # Our own seeded permutation rather than train_test_split: select(keep_in_memory=True)
    # writes no index cache files, so ranks splitting at the same time do not race on disk.
    order = list(range(len(records)))
    random.Random(cfg.train.seed).shuffle(order)
    n_eval = min(len(records) - 1, max(1, round(data.eval_fraction * len(records))))
    held, kept = sorted(order[:n_eval]), sorted(order[n_eval:])
    return (records.select(kept, keep_in_memory=True),
            records.select(held, keep_in_memory=True), data.path)


def build_datasets(cfg: RunConfig, tokenizer: Any) -> tuple[Dataset, Dataset | None]:
    """Tokenized train and eval datasets ({"input_ids", "labels"} rows) for the Trainer."""
    train, evaluation, source = split_records(cfg)
    train_ds = prepare(train, cfg.dataset, tokenizer, source)
    if evaluation is None:
        return train_ds, None
    eval_source = cfg.dataset.eval_path or f"{source} (held out)"
    return train_ds, prepare(evaluation, cfg.dataset, tokenizer, eval_source)


def count_tokens(cfg: RunConfig, tokenizer: Any) -> int:
    """Tokens the model reads per epoch of the train split (after truncation, no padding)."""
    train, _, source = split_records(cfg)
    return sum(len(row) for row in prepare(train, cfg.dataset, tokenizer, source)["input_ids"])


@dataclass
class Collator:
    """Right-pads a batch to its longest row: pad id in input_ids, 0 in attention_mask,
    -100 in labels. Falls back to eos for padding when the tokenizer has no pad token."""

    pad_token_id: int

    def __call__(self, rows: list[Mapping[str, list[int]]]) -> dict[str, Any]:
        import torch

        width = max(len(row["input_ids"]) for row in rows)
        input_ids, attention, labels = [], [], []
        for row in rows:
            fill = width - len(row["input_ids"])
            input_ids.append(list(row["input_ids"]) + [self.pad_token_id] * fill)
            attention.append([1] * len(row["input_ids"]) + [0] * fill)
            labels.append(list(row["labels"]) + [IGNORE_INDEX] * fill)
        return {
            "input_ids": torch.tensor(input_ids, dtype=torch.long),
            "attention_mask": torch.tensor(attention, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
        }


def collator(tokenizer: Any) -> Collator:
    """The batch collator for `build_datasets` rows."""
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id
    if pad is None:
        raise DataError("the tokenizer has neither a pad nor an eos token; give it a pad_token")
    return Collator(pad_token_id=int(pad))
