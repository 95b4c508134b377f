"""Streaming (`dataset.streaming`): the training set is tokenized in the data loader as the
run reads it, never up front, for corpora too large to tokenize (or hold) before training.

Each source is read lazily (`datasets`' streaming json/csv/parquet reader for a local file; a
hub dataset or a saved directory from its memory-mapped Arrow files) and shuffled in blocks
of `dataset.shuffle_buffer` rows; the sources are drawn by weight with `interleave_datasets`
(the up-front mixture's rule and seed), all before any row is tokenized. The drawn rows are
then cut into chunks, each encoded by the up-front path's Encoders and, packed, with TRL's
best-fit decreasing over the chunk (chunks.py), in tokenizing processes when there are
cores for them: in the files' order (shuffle_buffer=0) a stream's rows are the cache's.

Why blocks and not a rolling buffer: `datasets`' state_dict records every reader's position
and the interleave's generator, so the drawn stream restarts at the exact row, but a rolling
shuffle buffer's contents are not in it (its docs: the buffer is refilled). A block's order
is a seeded function of its position, so re-reading the block restores it. `StreamRows`
keeps, for every row it hands out, the stream's state before its chunk and its place in the
chunk; the checkpoint holds the first untrained row's (launcher/rank/callbacks/stream_state.py).
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from datasets import Features, Value

from launcher.config.compose import local_or_as_is
from launcher.data import mixture
from launcher.data.chunks import ChunkEncoder, encode_installed, install
from launcher.data.hub import Coordinates, load_hub
from launcher.data.loading import PACK_BATCH_ROWS, encoder_for, load_local
from launcher.errors import DataError

if TYPE_CHECKING:
    from datasets import IterableDataset

    from launcher.config.schema import RunConfig

TAGGED = Features({"source": Value("int32"), "row": Value("string")})
"""A drawn row before tokenizing (chunks.py): typed, or interleave_datasets would read each
source's head once more only to learn its columns."""
KEPT_STATES = 4096
"""States kept for rows handed out but not yet trained: the loader's read-ahead (a batch or
two per rank) is far below this."""


def raw_rows(cfg: RunConfig) -> IterableDataset:
    """cfg.dataset.path's rows, read lazily."""
    data = cfg.dataset
    local = Path(local_or_as_is(data.path))
    if not local.is_file():  # a hub id or a saved dataset: its cached Arrow files, mapped
        return load_hub(data.path, Coordinates.of(data)).to_iterable_dataset()
    return load_local(local, streaming=True)


def columns_of(rows: IterableDataset) -> list[str]:
    """A stream's columns (a JSON Lines reader knows them only from its first row)."""
    return list(rows.column_names or next(iter(rows.take(1)), {}))


def tagged_source(cfg: RunConfig, index: int, label: str, epoch: int) -> IterableDataset:
    """One source's rows (a one-dataset RunConfig), block-shuffled, each as (its index, its
    JSON text): cheap, nothing is tokenized yet."""
    rows = raw_rows(cfg)
    columns = columns_of(rows)
    block = cfg.dataset.shuffle_buffer
    if block > 1:
        rows = rows.map(shuffled_block(f"{cfg.train.seed}-{label}-{epoch}"), batched=True,
                        batch_size=block, with_indices=True)

    def tag(batch: Mapping[str, list]) -> dict[str, list]:
        count = len(batch[columns[0]])
        return {"source": [index] * count,
                "row": [json.dumps({key: batch[key][i] for key in columns}, default=str)
                        for i in range(count)]}
    return rows.map(tag, batched=True, remove_columns=columns, features=TAGGED)


def shuffled_block(seed: str) -> Callable[[Mapping[str, list], list[int]], dict[str, list]]:
    """A batched map that reorders each block, seeded by its first row's position."""
    def block(batch: Mapping[str, list], indices: list[int]) -> dict[str, list]:
        order = list(range(len(indices)))
        random.Random(f"{seed}-{indices[0]}").shuffle(order)
        return {key: [values[i] for i in order] for key, values in batch.items()}
    return block


def drawn_rows(cfg: RunConfig, epoch: int = 0) -> IterableDataset:
    """Pass `epoch`'s rows before tokenizing: one source, or the sources interleaved by
    weight (dataset.exhausted's rule, the up-front mixture's seed)."""
    from datasets import interleave_datasets

    data = cfg.dataset
    if not data.sources:
        return tagged_source(cfg, 0, data.name, epoch)
    parts = [tagged_source(one, index, name, epoch) for index, (one, name) in
             enumerate(zip(mixture.source_configs(cfg), mixture.labels(cfg), strict=True))]
    return interleave_datasets(
        parts, probabilities=mixture.shares(cfg), seed=cfg.train.seed,
        stopping_strategy=mixture.EXHAUSTED[data.exhausted])  # type: ignore[arg-type]


def chunk_encoder(cfg: RunConfig, tokenizer: Any) -> ChunkEncoder:
    return ChunkEncoder([encoder_for(one, tokenizer, columns_of(raw_rows(one)))
                         for one in mixture.parts(cfg)],
                        cfg.dataset.packing, cfg.dataset.max_length)


def chunk_rows(cfg: RunConfig) -> int:
    """Drawn rows encoded together: packed, the up-front cache's packing batch (so a stream
    in the files' order packs as the cache does); else fewer, for a quick first step."""
    return PACK_BATCH_ROWS if cfg.dataset.packing else 1_000


def processes(cfg: RunConfig) -> int:
    """Tokenizing processes per rank: dataset.num_proc, else the node's cores shared among
    its ranks (up to 4); 1: the rank tokenizes in its own process."""
    if cfg.dataset.num_proc > 0:
        return cfg.dataset.num_proc
    return max(1, min(4, (os.cpu_count() or 1) // max(1, cfg.cluster.gpus_per_node)))


def train_rows(cfg: RunConfig, tokenizer: Any) -> StreamRows:
    """The Trainer's training set under streaming."""
    return StreamRows(lambda epoch: drawn_rows(cfg, epoch), chunk_encoder(cfg, tokenizer),
                      chunk_rows(cfg), processes(cfg))


def chunks(stream: IterableDataset, size: int) -> Iterator[tuple[dict[str, Any], list]]:
    """(the stream's state before the chunk, the chunk's (source, row) pairs)."""
    rows, state = iter(stream), stream.state_dict()
    while chunk := [(row["source"], row["row"]) for row in islice(rows, size)]:
        yield state, chunk
        state = stream.state_dict()


class StreamRows(torch.utils.data.IterableDataset):
    """The Trainer's training set under streaming: the drawn rows in chunks, each encoded
    (and packed) by `encode`, in `processes` processes when more than 1 (the chunks ahead
    are encoded while the rows of the first are trained; their order is kept). It counts
    the rows handed out since the run began and keeps, for each, where it is read from: the
    stream's state before its chunk and its place in the chunk (`state_before`). Every rank
    reads the whole stream (accelerate's IterableDatasetShard keeps its slice of each global
    batch), so every rank's count and states are the same."""

    def __init__(self, make: Callable[[int], IterableDataset], encode: ChunkEncoder,
                 size: int, processes: int = 1) -> None:
        self.make, self.encode, self.size, self.processes = make, encode, size, processes
        self.epoch, self.rows, self.resumed = 0, 0, None
        self.states: deque[tuple[int, dict[str, Any]]] = deque(maxlen=KEPT_STATES)
        self.started, self.pool = False, None

    def load(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's `state_before`."""
        self.epoch, self.rows = int(state["epoch"]), int(state["rows"])
        self.resumed = dict(state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Pass after pass, never ending: a pass that ended inside a global batch would let
        accelerate fill the batch with repeated rows (or drop it), and the Trainer's count
        of rows trained would no longer be this one's. The run ends at train.max_steps."""
        if self.started and self.resumed is None:
            self.epoch += 1  # iterated again from the start: the next pass
        self.started = True
        while True:
            before = self.rows
            yield from self._pass()
            if self.rows == before:
                raise DataError("the stream gave no training row in a whole pass; check "
                                "the sources (every row dropped, or no rows at all)")
            self.epoch += 1

    def _pass(self) -> Iterator[dict[str, Any]]:
        stream, skip = self.make(self.epoch), 0
        if self.resumed is not None:
            if self.resumed["stream"] is not None:
                stream.load_state_dict(copy.deepcopy(self.resumed["stream"]))
            skip, self.resumed = int(self.resumed["skip"]), None
        for state, rows in self._encoded(chunks(stream, self.size)):
            for place in range(skip, len(rows)):
                self.states.append((self.rows, {"epoch": self.epoch, "rows": self.rows,
                                                "stream": state, "skip": place}))
                self.rows += 1
                yield rows[place]
            skip = 0

    def _encoded(self, pending: Iterator[tuple[dict[str, Any], list]]
                 ) -> Iterator[tuple[dict[str, Any], list]]:
        if self.processes <= 1:
            yield from ((state, self.encode(chunk)) for state, chunk in pending)
            return
        if self.pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: a rank's threads (gloo, NCCL, the watchdog) must not be forked
            self.pool = ProcessPoolExecutor(self.processes, multiprocessing.get_context("spawn"),
                                            initializer=install, initargs=(self.encode,))
        ahead: deque[tuple[dict[str, Any], Any]] = deque()
        for state, chunk in pending:
            ahead.append((state, self.pool.submit(encode_installed, chunk)))
            if len(ahead) > self.processes:
                done_state, future = ahead.popleft()
                yield done_state, future.result()
        while ahead:
            done_state, future = ahead.popleft()
            yield done_state, future.result()

    def state_before(self, row: int) -> dict[str, Any]:
        """Where row `row` (counted from the run's start) is read from: its pass, the count,
        the stream's state before its chunk and its place there."""
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
        return len(load_hub(cfg.dataset.path, Coordinates.of(cfg.dataset)))
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


def sampled_source(cfg: RunConfig, tokenizer: Any) -> dict[str, Any]:
    """One source's estimated rows, tokens and trained tokens, and its encoded sample."""
    from launcher.data.encode import IGNORE_INDEX

    rows = raw_rows(cfg)
    head = [(0, json.dumps(row, default=str)) for row in rows.take(SAMPLE_ROWS)]
    encode = ChunkEncoder([encoder_for(cfg, tokenizer, columns_of(rows))], False,
                          cfg.dataset.max_length)
    sample = encode(head)
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
    sampled = [sampled_source(one, tokenizer) for one in mixture.parts(cfg)]
    shares = mixture.shares(cfg)
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
    sources = mixture.source_figures(cfg, [part["rows"] for part in sampled],
                                     [part["tokens"] for part in sampled], drawn, shares)
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
