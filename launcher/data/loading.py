"""Training data: load rows, split off the eval set, encode and pack them, collate batches.

Runs where the data is prepared (preprocess.py) and in the ranks' collators; `datasets` and
TRL are imported inside functions. Packed batches carry position_ids restarting per example
and no attention mask: transformers derives the per-example mask from them
(`find_packed_sequence_indices` for sdpa/eager, varlen for flash-attention), and only with
use_cache=False, which the Trainer sets; the user's view: docs/guide.md, "Data".
"""

from __future__ import annotations

import logging
import os
import random
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.config.compose import PROJECT_ROOT, local_or_as_is
from launcher.data import mixture
from launcher.data.encode import (
    IGNORE_INDEX,
    PAIR_REPORT,
    SOURCE_ROW,
    Encoder,
    chat_template_for,
)
from launcher.data.formats import (
    FIELDS,
    PREFERENCE,
    TEMPLATE_FORMATS,
    RowError,
    column_map,
    missing_columns,
)
from launcher.data.hub import LOCAL_LOADERS, TRAIN_SPLIT, Coordinates, is_hub_id, load_hub
from launcher.errors import DataError

if TYPE_CHECKING:
    from datasets import Dataset

    from launcher.config.schema import RunConfig

log = logging.getLogger(__name__)


LARGE_ROWS = 20_000
"""From this many rows tokenizing uses several processes (below, their start-up costs more)
and intermediate results go to disk instead of memory."""
PACK_BATCH_ROWS = 10_000
"""Rows packed together (best-fit decreasing within each batch): the up-front cache's and a
stream's (stream.py), so both pack the same rows alike."""



# ---------------------------------------------------------------------------- loading


def load_records(path: str, fmt: str, renames: Mapping[str, str] | None = None,
                 where: Coordinates = TRAIN_SPLIT) -> Dataset:
    """Rows of a local .json/.jsonl/.csv/.parquet file, a local dataset directory or a hub
    dataset id (the split `where` names), checked for the columns `fmt` needs."""
    local = Path(local_or_as_is(path))
    if local.is_file():
        records, source = load_local(local), str(local)
    elif local.is_dir() or is_hub_id(path):
        records, source = load_hub(path, where), path
    else:
        raise DataError(
            f"dataset file {path} not found (looked in {Path.cwd()} and {PROJECT_ROOT}); "
            "fix dataset.path (a .json/.jsonl/.csv/.parquet file or a hub dataset id)"
        )
    check_fields(records.column_names, fmt, renames or {}, source)
    if len(records) == 0:
        raise DataError(f"{source}: the dataset has no rows; point dataset.path at real data")
    return records


def load_local(path: Path, streaming: bool = False) -> Any:
    """A local file's rows: a Dataset, or read lazily (an IterableDataset) with `streaming`."""
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
        return load_dataset(builder, data_files=str(path), split="train", streaming=streaming,
                            **kwargs)
    except Exception as exc:  # datasets raises many types for a malformed file
        raise DataError(f"{path}: cannot be read as {builder}: {exc}") from exc


def check_fields(columns: list[str], fmt: str, renames: Mapping[str, str], source: str) -> None:
    missing = missing_columns(fmt, column_map(fmt, renames, columns), columns)
    if not missing:
        return
    fields = ", ".join(FIELDS[fmt])
    raise DataError(
        f"{source}: dataset.format={fmt} needs column(s) {', '.join(map(repr, missing))} but "
        f"the data has {list(columns)}. Fix: map them with dataset.columns.<field>=<column> "
        f"(fields: {fields}), or set dataset.format to the format the data is in "
        f"({', '.join(FIELDS)})"
    )


def split_records(cfg: RunConfig) -> tuple[Dataset, Dataset | None, str]:
    """Train and eval records: `dataset.eval_path`, else `dataset.eval_fraction` of
    `dataset.path` held out with seed `train.seed` (None when the fraction is 0)."""
    data = cfg.dataset
    renames = asdict(data.columns)
    records = load_records(data.path, data.format, renames,
                           Coordinates.of(data))
    if data.eval_path:
        return records, load_records(data.eval_path, data.format, renames), data.path
    if data.eval_fraction <= 0:
        return records, None, data.path
    if len(records) < 2 or not 0 < data.eval_fraction < 1:
        raise DataError(
            f"{data.path}: cannot hold out dataset.eval_fraction={data.eval_fraction} of "
            f"{len(records)} row(s); use a fraction between 0 and 1 on more data, "
            "or set dataset.eval_path"
        )
    # A seeded permutation rather than train_test_split: select(keep_in_memory=True) writes
    # no index cache files.
    if data.format == PREFERENCE:  # a refused pair is named by its row in the file
        records = records.add_column(SOURCE_ROW, list(range(1, len(records) + 1)))
    order = list(range(len(records)))
    random.Random(cfg.train.seed).shuffle(order)
    n_eval = min(len(records) - 1, max(1, round(data.eval_fraction * len(records))))
    held, kept = sorted(order[:n_eval]), sorted(order[n_eval:])
    return (records.select(kept, keep_in_memory=True),
            records.select(held, keep_in_memory=True), data.path)


def eval_records(cfg: RunConfig) -> list[tuple[RunConfig, Dataset, str]]:
    """The eval set, part by part: (the config whose format and columns read it, its rows,
    its file). dataset.eval_path alone when set (its rows only, not the training file's
    too); else the share held out of dataset.path, or of each source of a mixture in turn;
    empty when there is none."""
    data = cfg.dataset
    if data.eval_path:
        reader = mixture.eval_file_config(cfg) if data.sources else cfg
        return [(reader, load_records(data.eval_path, data.format, asdict(data.columns)),
                 data.eval_path)]
    parts = []
    for one in mixture.parts(cfg):
        _, evaluation, source = split_records(one)
        if evaluation is not None:
            parts.append((one, evaluation, source))
    return parts


# ---------------------------------------------------------------------------- encoding


def encoder_for(cfg: RunConfig, tokenizer: Any, columns: list[str]) -> Encoder:
    """The Encoder of this config; says so once when the built-in template stands in."""
    data = cfg.dataset
    template, builtin = chat_template_for(tokenizer, data.template)
    if builtin and data.template == "auto" and data.format in TEMPLATE_FORMATS:
        log.warning("the tokenizer has no chat template; using the built-in "
                    "'### Human: / ### Assistant:' template")
    return Encoder(
        tokenizer=tokenizer, fmt=data.format,
        columns=column_map(data.format, asdict(data.columns), columns),
        template=template, max_length=data.max_length, mask_prompt=data.mask_prompt,
    )


def encode_splits(
    cfg: RunConfig, tokenizer: Any, progress: bool = True, whole: bool = True,
) -> tuple[Dataset, Dataset | None]:
    """Encoded (and, with dataset.packing, packed) train and eval sets; the problems of
    both in one DataError."""
    if not progress:
        import datasets

        datasets.disable_progress_bars()
    train_rows, eval_rows, source = split_records(cfg)
    encoder = encoder_for(cfg, tokenizer, train_rows.column_names)
    problems: list[str] = []

    def encoded(rows: Dataset, where: str, processes: int | None) -> Dataset:
        try:
            return encode(rows, encoder, where, processes)
        except DataError as error:
            problems.append(str(error))
            return rows

    train = encoded(train_rows, source, num_proc(cfg, len(train_rows)))
    evaluation = None
    if eval_rows is not None:
        evaluation = encoded(eval_rows, cfg.dataset.eval_path or f"{source} (held out)", None)
    if problems:
        raise DataError("\n".join(problems))
    if cfg.dataset.packing:
        train = pack(train, cfg.dataset.max_length)
        evaluation = pack(evaluation, cfg.dataset.max_length) if evaluation else None
    if whole:  # not one source of a mixture: the mixture is the training set
        check_batch(cfg, len(train), source)
    return train, evaluation


def encode(records: Dataset, encoder: Encoder, source: str, processes: int | None) -> Dataset:
    """input_ids and labels per row (format preference: TRL's pair columns, `_checked_pairs`);
    DataError naming the row on a bad one, or when no row has a trained token within
    dataset.max_length."""
    try:
        encoded = records.map(
            encoder.encode, batched=True, with_indices=True, num_proc=processes,
            remove_columns=records.column_names, desc=f"tokenizing {Path(source).name}",
            load_from_cache_file=False, keep_in_memory=len(records) < LARGE_ROWS,
        )
    except RowError as error:
        raise DataError(f"{source}: {error}") from None
    if encoder.fmt == PREFERENCE:
        return _checked_pairs(encoded, encoder.max_length, source)
    max_length, dropped = encoder.max_length, len(records) - len(encoded)
    if len(encoded) == 0:
        raise DataError(
            f"{source}: every one of the {dropped} example(s) is longer than dataset.max_length="
            f"{max_length} before its first trained token, so nothing is left to train on. "
            "Fix: raise dataset.max_length (up to the model's context) or shorten the data"
        )
    truncated = sum(1 for n in encoded["full_length"] if n > max_length)
    if dropped or truncated:
        log.warning("%s: %d example(s) truncated to dataset.max_length=%d, %d dropped (no "
                    "trained token left)", source, truncated, max_length, dropped)
    return encoded.remove_columns("full_length")


SHOWN_ROWS = 5
"""Refused pairs named one by one; the rest are counted."""


def _checked_pairs(encoded: Dataset, max_length: int, source: str) -> Dataset:
    """Every pair whose prompt leaves no room for an answer in one DataError (the prompt is
    kept whole, the answers are cut to fit: encode.py); the truncated answers and the
    prompts that lost tokens at their boundary counted in a warning."""
    import pyarrow.compute as pc

    table = encoded.with_format("arrow")[:]
    prompt = pc.list_value_length(table["prompt_ids"])
    refused = table.filter(pc.greater_equal(prompt, max_length))
    if refused.num_rows:
        rows = refused["row"].to_pylist()
        lengths = pc.list_value_length(refused["prompt_ids"]).to_pylist()
        named = ", ".join(f"row {row} ({length} tokens)"
                          for row, length in zip(rows[:SHOWN_ROWS], lengths, strict=False))
        rest = f" and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
        raise DataError(
            f"{source}: {len(rows)} preference pair(s) have a prompt of dataset.max_length="
            f"{max_length} tokens or more, which leaves no room for an answer (the prompt is "
            f"kept whole, only the answers are cut): {named}{rest} (rows counted from 1 in "
            f"the file: a JSON Lines file's line numbers). Fix: raise dataset.max_length above "
            f"the longest prompt ({max(lengths)} tokens; up to the model's context), or "
            "shorten or remove those rows"
        )
    truncated = int(pc.sum(pc.greater(table["full_length"], max_length)).as_py() or 0)
    split = int(pc.sum(pc.greater(table["prompt_split"], 0)).as_py() or 0)
    if truncated:
        log.warning("%s: %d pair(s) with an answer cut to fit dataset.max_length=%d after "
                    "the prompt", source, truncated, max_length)
    if split:
        log.warning("%s: %d pair(s) whose prompt, tokenized alone, is not a prefix of prompt "
                    "+ answer (a token merges across the boundary); their answers start where "
                    "the two diverge, as in TRL", source, split)
    return encoded.remove_columns(list(PAIR_REPORT))


def pack(encoded: Dataset, max_length: int) -> Dataset:
    """Whole examples into rows of `max_length` (TRL's best-fit decreasing), with
    position_ids restarting at 0 for each example."""
    from trl.data_utils import pack_dataset

    small = len(encoded) < LARGE_ROWS
    packed = pack_dataset(encoded, max_length, strategy="bfd",
                          map_kwargs={"batch_size": PACK_BATCH_ROWS, "keep_in_memory": small})
    return packed.map(positions, batched=True, remove_columns=["seq_lengths"],
                      keep_in_memory=small, desc="position ids")


def positions(batch: Mapping[str, list[Any]]) -> dict[str, list[list[int]]]:
    return {"position_ids": [[p for n in lengths for p in range(n)]
                             for lengths in batch["seq_lengths"]]}


def check_batch(cfg: RunConfig, rows: int, source: str) -> None:
    t, c = cfg.train, cfg.cluster
    world = c.nodes * c.gpus_per_node
    batch = t.micro_batch_size * t.grad_accum * world
    if rows < batch:
        raise DataError(
            f"{source}: {rows} training row(s) after encoding"
            f"{' and packing' if cfg.dataset.packing else ''}, fewer than one global batch "
            f"(train.micro_batch_size={t.micro_batch_size} x train.grad_accum={t.grad_accum} "
            f"x {world} rank(s) = {batch}). Fix: more data, or a smaller batch"
        )


def num_proc(cfg: RunConfig, rows: int) -> int | None:
    """Processes for `datasets.map`: dataset.num_proc, else the cores (up to 8) when large."""
    if cfg.dataset.num_proc > 0:
        return cfg.dataset.num_proc if cfg.dataset.num_proc > 1 else None
    cores = min(8, os.cpu_count() or 1)
    return cores if rows >= LARGE_ROWS and cores > 1 else None


# ---------------------------------------------------------------------------- batches


@dataclass
class Collator:
    """Right-pads a batch to its longest row: pad id in input_ids, -100 in labels. Unpacked
    rows get an attention_mask (0 on padding); packed rows get position_ids instead (the
    padding is one more sequence with its own positions) and no mask, so attention follows
    the example boundaries. Under sequence parallelism (sp_width set) every batch is
    padded to that one width, divisible by sp (the Ulysses loader all-gathers the batches
    of a group, and gloo needs equal shapes), and has position_ids (Ulysses shards the
    sequence and keeps only them); right padding needs no mask there: causal attention
    never reads a later token."""

    pad_token_id: int
    packed: bool = False
    sp_width: int | None = None

    def __call__(self, rows: list[Mapping[str, list[int]]]) -> dict[str, Any]:
        import torch

        width = self.sp_width or max(len(row["input_ids"]) for row in rows)
        batch: dict[str, list[list[int]]] = defaultdict(list)
        for row in rows:
            fill = width - len(row["input_ids"])
            batch["input_ids"].append(list(row["input_ids"]) + [self.pad_token_id] * fill)
            batch["labels"].append(list(row["labels"]) + [IGNORE_INDEX] * fill)
            if self.packed:
                batch["position_ids"].append(list(row["position_ids"]) + list(range(fill)))
                continue
            batch["attention_mask"].append([1] * len(row["input_ids"]) + [0] * fill)
            if self.sp_width:
                batch["position_ids"].append(list(range(width)))
        return {key: torch.tensor(value, dtype=torch.long) for key, value in batch.items()}


def collator(tokenizer: Any, packed: bool = False, sp: int = 1,
             max_length: int = 0) -> Collator:
    """The batch collator for encoded rows (packed: rows with position_ids; sp: the
    sequence-parallel size, whose batches are max_length rounded up to a multiple of sp)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise DataError("the tokenizer has neither a pad nor an eos token; give it a pad_token")
    sp_width = -(-max_length // sp) * sp if sp > 1 else None
    return Collator(pad_token_id=int(pad), packed=packed, sp_width=sp_width)
