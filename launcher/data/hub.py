"""Datasets on the Hugging Face hub by name: loaded with `datasets` into the user's HF cache,
and pinned to the commit they resolve to when a run is planned, so that every rank, a
resumed launch and a later rerun read the same rows. Offline (HF_HUB_OFFLINE, or no route
to the hub) a cached dataset resolves to its cached build's commit; an uncached one is
refused before anything starts, with the command that fills the cache.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.config.compose import local_or_as_is
from launcher.data.eval_tasks import hub_offline
from launcher.errors import DataError

if TYPE_CHECKING:
    from datasets import Dataset

    from launcher.config.schema import DatasetConfig, SourceConfig

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
LOCAL_LOADERS: dict[str, str] = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}
"""File suffix -> the `datasets` builder that reads it (loading.py); a name with one of
these suffixes is a local file, never a hub id."""


@dataclass(frozen=True)
class Coordinates:
    """Which part of a hub dataset: load_dataset's name, split and revision."""

    subset: str = ""
    split: str = "train"
    revision: str = ""

    @classmethod
    def of(cls, entry: DatasetConfig | SourceConfig) -> Coordinates:
        """A dataset section's or a mixture source's (both have subset, split, revision)."""
        return cls(entry.subset, entry.split, entry.revision)

    def shown(self, dataset_id: str) -> str:
        """As load_dataset is called (for messages and the fetch command)."""
        args = [repr(dataset_id)] + [f"{key}={value!r}" for key, value in (
            ("name", self.subset), ("split", self.split), ("revision", self.revision)) if value]
        return f"load_dataset({', '.join(args)})"


TRAIN_SPLIT = Coordinates()
"""The default: the dataset's train split, newest revision."""


def is_hub_id(path: str) -> bool:
    """Not a local file or directory, and shaped like `name` or `owner/name`."""
    local = Path(local_or_as_is(path))
    return (bool(path) and not local.exists() and local.suffix.lower() not in LOCAL_LOADERS
            and HUB_ID.match(path) is not None)


def load_hub(dataset_id: str, where: Coordinates) -> Dataset:
    """A hub dataset's split, or a local dataset directory's: from the HF cache without
    asking the hub when the cache holds the pinned commit (a compute node without a route
    to the hub would otherwise wait out the hub client's retries), else from the hub."""
    from datasets import load_dataset

    pinned_and_cached = bool(where.revision) and cached_build(dataset_id, where) == where.revision
    try:
        with hub_offline(pinned_and_cached):
            return load_dataset(dataset_id, name=where.subset or None, split=where.split,
                                revision=where.revision or None)
    except Exception as exc:  # network, auth, missing split: all mean the same to the user
        raise DataError(
            f"cannot load dataset {dataset_id!r} ({type(exc).__name__}: {exc}); check the id "
            "and network access, or download it and set dataset.path to a local "
            ".json/.jsonl/.csv/.parquet file"
        ) from exc


def cached_build(dataset_id: str, where: Coordinates) -> str | None:
    """The commit of the newest build of the dataset in the HF cache, None if none."""
    from datasets import load_dataset_builder

    try:
        with hub_offline():
            return str(load_dataset_builder(dataset_id, name=where.subset or None).hash)
    except Exception:  # noqa: BLE001 - not cached, in any of datasets' ways of saying it
        return None


def pinned_revision(dataset_id: str, where: Coordinates, offline: bool) -> str:
    """The commit `where.revision` (empty: the newest) resolves to, from the hub or, offline,
    from the cached build; DataError naming the fetch command when it is not cached."""
    from datasets import load_dataset_builder

    try:
        with hub_offline(offline):
            builder = load_dataset_builder(dataset_id, name=where.subset or None,
                                           revision=where.revision or None)
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        home = os.environ.get("HF_HOME") or "~/.cache/huggingface"
        if offline:
            raise DataError(
                f"not in the HF cache ({home}), and the hub is unreachable from here "
                f"({reason}). Fix: where the hub is reachable, with the same HF_HOME, run "
                f"`python -c \"import datasets; datasets.{where.shown(dataset_id)}\"` (or `ftl "
                "preprocess` with these overrides), then run this again"
            ) from None
        raise DataError(f"cannot be resolved on the hub ({reason}). Fix: check the id, its "
                        "subset and revision, and the access token (HF_TOKEN)") from None
    return str(builder.hash)
