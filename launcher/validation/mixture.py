"""Rules on a mixture of datasets (dataset.sources), part of rules.data_problems: every
source's keys named as typed (dataset.sources.N.KEY=VALUE), all in one message. Its files
and hub ids are preflight's (row scans, hub revisions). And a stream's (dataset.streaming):
what preprocessing reads (`mixture_problems`), what training needs (`streaming_problems`)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict
from typing import TYPE_CHECKING

from launcher.data.formats import FIELDS, FORMATS, PREFERENCE, unknown_renames
from launcher.data.mixture import formats, label
from launcher.errors import flagged

if TYPE_CHECKING:
    from launcher.config.schema import RunConfig, SourceConfig

PLAIN = re.compile(r"^[\w][\w.-]*$")
"""A source's label becomes part of its cache folder's name."""


def mixture_problems(cfg: RunConfig) -> list[str]:
    data = cfg.dataset
    problems = flagged([
        (not data.sources and not data.path,
         "dataset.path: empty, and dataset.sources is empty too. Fix: dataset.path=FILE (or a "
         "hub dataset id), or dataset.sources=[{path:FILE,weight:1},...] for a mixture."),
    ])
    for index, source in enumerate(data.sources):
        problems += _source_problems(f"dataset.sources.{index}", source, data.format)
    names = Counter(label(source) for source in data.sources)
    problems += [f"dataset.sources: {count} sources are named {name!r} (each source's name "
                 "labels its share and its cache folder). Fix: dataset.sources.N.name=OTHER "
                 "on all but one." for name, count in names.items() if count > 1]
    read = formats(cfg)
    problems += flagged([
        (data.shuffle_buffer < 0,
         f"dataset.shuffle_buffer={data.shuffle_buffer}: rows per shuffled block, >= 0. Fix: "
         "e.g. 10000, or 0 for the files' order."),
        (data.streaming and PREFERENCE in read,
         "dataset.streaming=true: preference pairs are tokenized up front (TRL's DPO trainer "
         "reads a whole dataset). Fix: dataset.streaming=false."),
    ])
    if PREFERENCE in read and len(read) > 1:
        others = ", ".join(sorted(read - {PREFERENCE}))
        problems.append(
            f"dataset.sources: preference pairs mixed with {others} "
            "rows: a run trains one objective (pairs: objective=dpo; the others: sft). Fix: "
            "a mixture of preference sources only, or of no preference source.")
    return problems


def _source_problems(key: str, source: SourceConfig, dataset_format: str) -> list[str]:
    fmt = source.format or dataset_format
    name = label(source)
    problems = flagged([
        (not source.path,
         f"{key}.path: empty. Fix: a local .json/.jsonl/.csv/.parquet file, a saved dataset "
         "directory or a hub dataset id."),
        (not (source.weight > 0 and math.isfinite(source.weight)),
         f"{key}.weight={source.weight}: a source's share of the mixture, relative to the "
         "others', must be > 0. Fix: a positive weight (e.g. 1), or leave the source out."),
        (fmt not in FORMATS,
         f"{key}.format={fmt}: not one of {', '.join(FORMATS)}. Fix: pick one (empty: "
         "dataset.format)."),
        (bool(source.path) and not PLAIN.match(name),
         f"{key}.name={name!r}: the source's name is one plain folder-name part. Fix: "
         f"{key}.name=NAME (letters, digits, _ . -)."),
    ])
    if fmt in FIELDS:
        renames = asdict(source.columns)
        problems += [f"{key}.columns.{field}={renames[field]}: format {fmt} has no field "
                     f"{field!r}. Fix: rename one of its fields ({', '.join(FIELDS[fmt])})."
                     for field in unknown_renames(fmt, renames)]
    return problems


def streaming_problems(cfg: RunConfig) -> list[str]:
    """What training a stream needs: a step count (a stream has no length the Trainer could
    count), one data-parallel layout (every rank reads the stream and keeps its slice), and
    an eval set that is a file (a share of a stream cannot be held out before it is read)."""
    data, train, parallel = cfg.dataset, cfg.train, cfg.parallel
    if not data.streaming:
        return []
    return flagged([
        (train.max_steps <= 0,
         f"train.max_steps={train.max_steps}: dataset.streaming=true needs a step count (the "
         f"stream has no length to count epochs by; train.epochs={train.epochs:g} cannot end "
         "it). Fix: train.max_steps=N; `ftl preprocess` with these overrides estimates one "
         "pass's rows, so N = passes x rows / the global batch."),
        (parallel.tp > 1 or parallel.sp > 1,
         f"parallel.tp={parallel.tp}, parallel.sp={parallel.sp}: dataset.streaming=true "
         "reads the stream on every rank for data parallelism only. Fix: parallel.tp=1 "
         "parallel.sp=1, or dataset.streaming=false."),
        (data.eval_fraction > 0 and not data.eval_path,
         f"dataset.eval_fraction={data.eval_fraction:g}: a stream's share cannot be held out "
         "before it is read. Fix: dataset.eval_path=FILE (tokenized up front), or "
         "dataset.eval_fraction=0."),
    ])
