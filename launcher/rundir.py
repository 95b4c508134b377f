"""Atomic creation of a run dir: every file is written into a hidden temp dir, which is then
renamed into place, so a run dir either exists complete or not at all."""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path


def new_run_dir_path(output_dir: str, run_name: str, now: datetime | None = None) -> Path:
    """outputs/<name>/<timestamp>, with a -N suffix if that second is taken."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / run_name
    candidate, counter = base / stamp, 1
    while candidate.exists():
        candidate, counter = base / f"{stamp}-{counter}", counter + 1
    return candidate


def write_run_dir(final: Path, files: dict[str, str], executable: tuple[str, ...] = ()) -> Path:
    """Write `files` (relative name -> text) under `final` atomically; returns `final`."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".tmp-{final.name}-{os.getpid()}"
    try:
        staging.mkdir()
        for name, text in files.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            if name in executable:
                target.chmod(0o755)
        (staging / "logs").mkdir(exist_ok=True)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final
