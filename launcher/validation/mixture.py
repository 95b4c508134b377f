"""Rules on a mixture of datasets (dataset.sources), part of rules.data_problems: every
source's keys named as typed (dataset.sources.N.KEY=VALUE), all in one message. Its files
and hub ids are preflight's (row scans, hub revisions)."""

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
