"""Streaming (`dataset.streaming`): the training set is tokenized in the data loader as the
run reads it, never up front, for corpora too large to tokenize (or hold) before training.

Each source is read lazily (`datasets`' streaming json/csv/parquet reader for a local file; a
hub dataset or a saved directory from its memory-mapped Arrow files), shuffled in blocks of
`dataset.shuffle_buffer` rows, encoded by the same Encoder as the up-front path, drawn by
weight with `interleave_datasets` (the up-front mixture's rule and seed), and packed with
TRL's best-fit decreasing over the same 10,000-row batches as `loading.pack`: in file order
(shuffle_buffer=0) a stream's rows are the up-front cache's.

Why blocks and not a rolling buffer: `datasets`' state_dict records every reader's position,
the interleave's generator and a batched map's place in its batch, so a stream restarts at
the exact row, but a rolling shuffle buffer's contents are not in it (its docs: the buffer
is refilled). A block's order is a seeded function of its position, so re-reading the block
restores it. `StreamRows` keeps the state before each row it hands out; the checkpoint holds
the one of the first row not yet trained (launcher/rank/callbacks/stream_state.py).
"""

from __future__ import annotations

import copy
import random
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from launcher.config.compose import local_or_as_is
from launcher.data import mixture
from launcher.data.hub import LOCAL_LOADERS, Coordinates, load_hub
from launcher.data.loading import PACK_BATCH_ROWS, encoder_for, positions
from launcher.errors import DataError

if TYPE_CHECKING:
    from datasets import IterableDataset

    from launcher.config.schema import RunConfig

KEPT_STATES = 4096
"""States kept for rows handed out but not yet trained: the loader's read-ahead (a batch or
two per rank) is far below this."""


def raw_rows(cfg: RunConfig) -> IterableDataset:
    """cfg.dataset.path's rows, read lazily."""
    from datasets import load_dataset

    data = cfg.dataset
    local = Path(local_or_as_is(data.path))
    if not local.is_file():  # a hub id or a saved dataset: its cached Arrow files, mapped
        where = Coordinates(data.subset, data.split, data.revision)
        return load_hub(data.path, where).to_iterable_dataset()
    builder = LOCAL_LOADERS.get(local.suffix.lower())
    if builder is None:
        raise DataError(f"{local}: unsupported file type {local.suffix!r}; convert it to one "
                        f"of {', '.join(LOCAL_LOADERS)}")
    kwargs: dict[str, Any] = {"keep_default_na": False} if builder == "csv" else {}
    return load_dataset(builder, data_files=str(local), split="train", streaming=True, **kwargs)


def first_rows(cfg: RunConfig, count: int) -> list[dict[str, Any]]:
    return list(raw_rows(cfg).take(count))


def encoded_source(cfg: RunConfig, tokenizer: Any, label: str, epoch: int) -> IterableDataset:
    """One source (a one-dataset RunConfig): block-shuffled, encoded (input_ids, labels)."""
    rows = raw_rows(cfg)
    columns = list(first_rows(cfg, 1)[0]) if rows.column_names is None else rows.column_names
    block = cfg.dataset.shuffle_buffer
    if block > 1:
        rows = rows.map(shuffled_block(f"{cfg.train.seed}-{label}-{epoch}"), batched=True,
                        batch_size=block, with_indices=True)
    encoder = encoder_for(cfg, tokenizer, columns)
    encoded = rows.map(encoder.encode, batched=True, with_indices=True, remove_columns=columns)
    return encoded.remove_columns("full_length")


def shuffled_block(seed: str) -> Callable[[Mapping[str, list], list[int]], dict[str, list]]:
    """A batched map that reorders each block, seeded by its first row's position."""
    def block(batch: Mapping[str, list], indices: list[int]) -> dict[str, list]:
        order = list(range(len(indices)))
        random.Random(f"{seed}-{indices[0]}").shuffle(order)
        return {key: [values[i] for i in order] for key, values in batch.items()}
    return block


def train_stream(cfg: RunConfig, tokenizer: Any, epoch: int = 0) -> IterableDataset:
    """The training rows of pass `epoch`: one source, or the sources interleaved by weight
    (dataset.exhausted's rule), packed with dataset.packing."""
    from datasets import interleave_datasets

    data = cfg.dataset
    if data.sources:
        parts = [encoded_source(one, tokenizer, name, epoch) for one, name in
                 zip(mixture.source_configs(cfg), mixture.labels(cfg), strict=True)]
        total = sum(source.weight for source in data.sources)
        stream = interleave_datasets(
            parts, probabilities=[source.weight / total for source in data.sources],
            seed=cfg.train.seed, stopping_strategy=mixture.EXHAUSTED[data.exhausted])  # type: ignore[arg-type]
    else:
        stream = encoded_source(cfg, tokenizer, data.name, epoch)
    if not data.packing:
        return stream
    from trl.data_utils import pack_dataset

    packed = pack_dataset(stream, data.max_length, strategy="bfd",
                          map_kwargs={"batch_size": PACK_BATCH_ROWS})
    return packed.map(positions, batched=True, remove_columns=["seq_lengths"])


class StreamRows(torch.utils.data.IterableDataset):
    """The Trainer's training set under streaming: `train_stream`'s rows, pass after pass,
    counting the rows handed out since the run began and keeping the stream's state before
    each, so a checkpoint can name where the first untrained row starts (`state_before`).
    Every rank reads the whole stream (accelerate's IterableDatasetShard keeps its slice of
    each global batch), so every rank's count and states are the same."""

    def __init__(self, make: Callable[[int], IterableDataset]) -> None:
        self.make = make
        self.epoch, self.rows, self.resumed = 0, 0, None
        self.states: deque[tuple[int, dict[str, Any]]] = deque(maxlen=KEPT_STATES)
        self.started = False

    def load(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's `state_before`."""
        self.epoch, self.rows = int(state["epoch"]), int(state["rows"])
        self.resumed = state["stream"]

    def set_epoch(self, epoch: int) -> None:
        """The Trainer's count of passes restarts at 0 on resume; this one owns its own."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.started and self.resumed is None:
            self.epoch += 1  # a new pass: the Trainer asks again after the stream ran out
        self.started = True
        stream = self.make(self.epoch)
        if self.resumed is not None:
            stream.load_state_dict(copy.deepcopy(self.resumed))
        before, self.resumed = stream.state_dict(), None
        for row in stream:
            self.states.append((self.rows, {"epoch": self.epoch, "rows": self.rows,
                                            "stream": before}))
            self.rows += 1
            yield row
            before = stream.state_dict()
        self.states.append((self.rows, {"epoch": self.epoch + 1, "rows": self.rows,
                                        "stream": None}))

    def state_before(self, row: int) -> dict[str, Any]:
        """Where row `row` (counted from the run's start) is read from: its pass, the count,
        and the stream's state (None: the pass's start)."""
        for number, state in reversed(self.states):
            if number == row:
                return state
        raise DataError(f"the stream's state before row {row} is no longer kept (rows "
                        f"{self.states[0][0] if self.states else 0}-{self.rows} are)")


# ---------------------------------------------------------------------------- figures

SAMPLE_ROWS = 1000
"""Rows of each source encoded to estimate a pass's tokens without tokenizing the pass."""


def source_rows(cfg: RunConfig) -> int:
    """A source's rows: exact for parquet, hub and saved datasets and for a line file shorter
    than the sample; else its size over the mean size of its first SAMPLE_ROWS lines."""
    local = Path(local_or_as_is(cfg.dataset.path))
    if not local.is_file():
        data = cfg.dataset
        return len(load_hub(data.path, Coordinates(data.subset, data.split, data.revision)))
    if local.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(local).metadata.num_rows)
    header = 1 if local.suffix.lower() == ".csv" else 0
    with local.open("rb") as handle:
        lines = [line for _, line in zip(range(SAMPLE_ROWS + header), handle, strict=False)
                 if line.strip()]
    if len(lines) < SAMPLE_ROWS + header:
        return len(lines) - header
    return round(local.stat().st_size / (sum(map(len, lines)) / len(lines))) - header


def sampled_source(cfg: RunConfig, tokenizer: Any, label: str) -> dict[str, Any]:
    """One source's estimated rows, tokens and trained tokens, and its encoded sample."""
    from launcher.data.encode import IGNORE_INDEX

    unshuffled = copy.deepcopy(cfg)
    unshuffled.dataset.shuffle_buffer = 0
    sample = list(encoded_source(unshuffled, tokenizer, label, 0).take(SAMPLE_ROWS))
    if not sample:
        raise DataError(f"{cfg.dataset.path}: no example of its first {SAMPLE_ROWS} rows has "
                        f"a trained token within dataset.max_length={cfg.dataset.max_length}")
    rows = source_rows(cfg)
    tokens = sum(len(row["input_ids"]) for row in sample)
    trained = sum(label != IGNORE_INDEX for row in sample for label in row["labels"])
    return {"rows": rows, "tokens": round(rows * tokens / len(sample)),
            "trained_tokens": round(rows * trained / len(sample)), "sample": sample}


def estimate(cfg: RunConfig, tokenizer: Any) -> dict[str, Any]:
    """A pass's figures, estimated from the sources' sizes and an encoded sample of each: its
    rows (packed, with dataset.packing), tokens, trained tokens, fill, and per source the
    examples it gives to the pass under dataset.exhausted's rule."""
    data = cfg.dataset
    configs = mixture.source_configs(cfg) if data.sources else [cfg]
    names = mixture.labels(cfg) if data.sources else [data.name]
    weights = [source.weight for source in data.sources] or [1.0]
    sampled = [sampled_source(one, tokenizer, name)
               for one, name in zip(configs, names, strict=True)]
    shares = [weight / sum(weights) for weight in weights]
    passes = [part["rows"] / share for part, share in zip(sampled, shares, strict=True)]
    total = min(passes) if data.exhausted == "stop" else max(passes)
    drawn = [min(part["rows"], round(total * share)) if data.exhausted == "stop"
             else round(total * share) for part, share in zip(sampled, shares, strict=True)]
    tokens = sum(round(n * part["tokens"] / part["rows"])
                 for n, part in zip(drawn, sampled, strict=True))
    trained = sum(round(n * part["trained_tokens"] / part["rows"])
                  for n, part in zip(drawn, sampled, strict=True))
    fill = _sample_fill(cfg, [row for part in sampled for row in part["sample"]])
    rows = round(tokens / (fill * data.max_length)) if data.packing else sum(drawn)
    sources = [{"name": name, "path": source.path, "revision": source.revision,
                "weight": source.weight, "share": round(share, 4), "rows": part["rows"],
                "tokens": part["tokens"], "drawn": n, "drawn_share": round(share, 4)}
               for name, source, part, share, n in zip(names, data.sources, sampled, shares, drawn,
                                                       strict=False)]
    return {"rows": rows, "tokens": tokens, "trained_tokens": trained,
            "fill": round(fill if data.packing else tokens / (rows * data.max_length), 4),
            "sources": sources}


def _sample_fill(cfg: RunConfig, sample: list[dict[str, Any]]) -> float:
    """How full packed rows of the sampled examples are."""
    if not cfg.dataset.packing:
        return 1.0
    from datasets import Dataset

    from launcher.data.loading import pack

    packed = pack(Dataset.from_list(sample), cfg.dataset.max_length)
    return sum(map(len, packed["input_ids"])) / (len(packed) * cfg.dataset.max_length)
