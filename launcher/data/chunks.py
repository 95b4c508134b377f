"""A stream's chunks encoded (and packed): the work stream.py hands to its tokenizing
processes. Apart from stream.py so that a spawned process imports no torch: it needs the
encoders, `datasets` and TRL only when packing.

A chunk is consecutive rows of the drawn stream, each `(source, JSON text of the row)`:
rows of sources in different formats have different columns, and one column of text lets
`interleave_datasets` draw them into one stream before any is tokenized.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from launcher.data.encode import Encoder

Row = dict[str, list[int]]
PARENT_POLL_S = 1.0
"""How often a tokenizing process checks that its rank is still there."""


@dataclass(frozen=True)
class ChunkEncoder:
    """Picklable: sent once to each tokenizing process."""

    encoders: list[Encoder]
    """One per source, by its index."""
    packing: bool
    max_length: int

    def __call__(self, chunk: list[tuple[int, str]]) -> list[Row]:
        """The chunk's training rows, in its order: examples with a trained token, packed
        together with `packing` (best-fit decreasing over the chunk, as loading.pack does
        over each batch of the up-front cache)."""
        encoded: list[dict[str, Any] | None] = [None] * len(chunk)
        by_source: dict[int, list[int]] = defaultdict(list)
        for position, (source, _) in enumerate(chunk):
            by_source[source].append(position)
        for source, positions in by_source.items():
            rows = [json.loads(chunk[position][1]) for position in positions]
            for position, example in zip(
                    positions, self.encoders[source].examples(rows, positions), strict=True):
                encoded[position] = example
        kept = [{"input_ids": e["input_ids"], "labels": e["labels"]}
                for e in encoded if e is not None]
        if not self.packing or not kept:
            return kept
        from datasets import Dataset

        from launcher.data.loading import pack

        packed = pack(Dataset.from_list(kept), self.max_length)
        return packed.to_list()


_INSTALLED: list[ChunkEncoder] = []
"""The tokenizing process's encoder (`install`)."""


def install(encoder: ChunkEncoder) -> None:
    """ProcessPoolExecutor's initializer: the encoders arrive once, not with every chunk;
    and the process ends with the rank that started it."""
    import datasets

    datasets.disable_progress_bars()
    _INSTALLED[:] = [encoder]
    parent = os.getppid()
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()


def _end_with(parent: int) -> None:
    """A rank leaves with os._exit (and may be killed): no shutdown reaches its pool, whose
    processes hold both ends of their own queue and so never see it close."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def encode_installed(chunk: list[tuple[int, str]]) -> list[Row]:
    return _INSTALLED[0](chunk)
