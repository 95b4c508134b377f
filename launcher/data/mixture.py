"""A mixture of datasets (`dataset.sources`): each source is one dataset of its own, as
`dataset.path` is (its RunConfig: `source_config`), tokenized and cached by content on its
own; the mixture is an index of (source, row) pairs drawn by weight with `datasets`'
interleave_datasets, seeded with train.seed, so changing a weight re-tokenizes nothing.
preprocess.py builds and caches it; the user's view: docs/guide.md, "Mixtures".
"""

from __future__ import annotations

import copy
import random
from dataclasses import asdict
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from launcher.config.schema import ColumnsConfig, SourceConfig

if TYPE_CHECKING:
    from launcher.config.schema import RunConfig

EXHAUSTED = {"stop": "first_exhausted", "repeat": "all_exhausted"}
"""dataset.exhausted -> interleave_datasets' stopping_strategy (LLaMA-Factory's
interleave_under and interleave_over)."""


def label(source: SourceConfig) -> str:
    """The source's name: its own, else the file's stem or the hub id's last part."""
    return source.name or PurePath(source.path.rstrip("/")).stem or source.path


def labels(cfg: RunConfig) -> list[str]:
    return [label(source) for source in cfg.dataset.sources]


def formats(cfg: RunConfig) -> set[str]:
    """The row formats the run reads: each source's, else dataset.format."""
    data = cfg.dataset
    return {source.format or data.format for source in data.sources} or {data.format}


def parts(cfg: RunConfig) -> list[RunConfig]:
    """Each source as a one-dataset RunConfig; one dataset: cfg itself."""
    return source_configs(cfg) if cfg.dataset.sources else [cfg]


def shares(cfg: RunConfig) -> list[float]:
    """Each source's share of the draw, from the weights; one dataset: [1.0]."""
    weights = [source.weight for source in cfg.dataset.sources] or [1.0]
    return [weight / sum(weights) for weight in weights]


def source_figures(cfg: RunConfig, rows: list[int], tokens: list[int], drawn: list[int],
                   drawn_shares: list[float]) -> list[dict[str, Any]]:
    """`Prepared.sources`: each source's name, path, revision, weight and share, its own
    rows and tokens, and its examples in the mixture; empty for one dataset."""
    return [{"name": label(source), "path": source.path, "revision": source.revision,
             "weight": source.weight, "share": round(share, 4), "rows": n_rows,
             "tokens": n_tokens, "drawn": n_drawn, "drawn_share": round(drawn_share, 4)}
            for source, share, n_rows, n_tokens, n_drawn, drawn_share in zip(
                cfg.dataset.sources, shares(cfg), rows, tokens, drawn, drawn_shares,
                strict=False)]


def source_config(cfg: RunConfig, index: int) -> RunConfig:
    """Source `index` as a one-dataset RunConfig: its path, format, columns and hub
    coordinates, unpacked (the mixture is packed as a whole), its own share held out for
    evaluation unless the mixture has one eval file (dataset.eval_path)."""
    data, source = cfg.dataset, cfg.dataset.sources[index]
    single = copy.deepcopy(cfg)
    own = single.dataset
    own.name = f"{data.name}.{label(source)}"
    own.path, own.subset, own.split, own.revision = (
        source.path, source.subset, source.split, source.revision)
    own.format = source.format or data.format
    own.columns = _columns(source, data.format, data.columns)
    own.sources, own.packing, own.eval_path = [], False, ""
    own.eval_fraction = 0.0 if data.eval_path else data.eval_fraction
    return single


def source_configs(cfg: RunConfig) -> list[RunConfig]:
    return [source_config(cfg, index) for index in range(len(cfg.dataset.sources))]


def eval_file_config(cfg: RunConfig) -> RunConfig:
    """The mixture's one eval file (dataset.eval_path, in dataset.format) as a dataset of
    its own: its whole train split is the mixture's eval set."""
    single = copy.deepcopy(cfg)
    own = single.dataset
    own.name = f"{cfg.dataset.name}.eval"
    own.path, own.eval_path, own.eval_fraction = cfg.dataset.eval_path, "", 0.0
    own.subset, own.split, own.revision = "", "train", ""
    own.sources, own.packing = [], False
    return single


def _columns(source: SourceConfig, dataset_format: str, shared: ColumnsConfig) -> ColumnsConfig:
    """The source's renames; dataset.columns' fill the fields it leaves empty where the
    source is in dataset.format (another format's renames name other fields)."""
    own = asdict(source.columns)
    if (source.format or dataset_format) != dataset_format:
        return ColumnsConfig(**own)
    return ColumnsConfig(**{key: own[key] or value for key, value in asdict(shared).items()})


def mixture_index(sizes: list[int], weights: list[float], seed: int,
                  exhausted: str) -> tuple[list[int], list[int]]:
    """(source, row) of every training example of the mixture, in order: each source's rows
    shuffled (seeded: a source cut short by `stop` gives a random share, not its head),
    interleaved with probabilities proportional to the weights."""
    from datasets import Dataset, interleave_datasets

    parts = []
    for index, size in enumerate(sizes):
        rows = list(range(size))
        random.Random(f"{seed}-{index}").shuffle(rows)
        parts.append(Dataset.from_dict({"source": [index] * size, "row": rows}))
    total = sum(weights)
    mixed = interleave_datasets(parts, probabilities=[w / total for w in weights], seed=seed,
                                stopping_strategy=EXHAUSTED[exhausted])  # type: ignore[arg-type]
    table = mixed.with_format("arrow")[:]
    return table["source"].to_pylist(), table["row"].to_pylist()
