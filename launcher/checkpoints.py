"""Which checkpoint a run resumes from, and what makes a checkpoint complete.

The Trainer writes `checkpoint-N/` piece by piece from every rank (model, optimizer
shards, scheduler, RNG states, trainer_state.json). A crash in the middle leaves a
directory that looks like a checkpoint but cannot be resumed from. So a checkpoint counts
only once rank 0 has written the COMPLETE marker, which it does after a barrier at the end
of the save (launcher/callbacks.py), i.e. after every rank has finished writing.

No torch import here: the CLI and the Slurm code call `latest_complete_checkpoint` too.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from launcher.errors import ConfigError

COMPLETE_MARKER = "COMPLETE"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_step(path: Path) -> int | None:
    """N for a directory named checkpoint-N, else None."""
    match = CHECKPOINT_PATTERN.match(path.name)
    return int(match.group(1)) if match else None


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """checkpoint-N directories of `checkpoints_dir`, oldest step first."""
    if not checkpoints_dir.is_dir():
        return []
    found = [p for p in checkpoints_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / COMPLETE_MARKER).is_file()


def latest_complete_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The highest-step checkpoint with a COMPLETE marker; half-written ones are skipped."""
    complete = [p for p in list_checkpoints(checkpoints_dir) if is_complete(p)]
    return complete[-1] if complete else None


def write_complete_marker(checkpoint: Path, step: int, world_size: int) -> None:
    """Called by rank 0 only, after every rank has finished writing `checkpoint`."""
    info = {"step": step, "world_size": world_size, "time": time.time()}
    tmp = checkpoint / f".{COMPLETE_MARKER}.tmp"
    tmp.write_text(json.dumps(info) + "\n", encoding="utf-8")
    tmp.rename(checkpoint / COMPLETE_MARKER)  # atomic: the marker is there whole or not at all


def resolve_resume(resume: str, checkpoints_dir: Path) -> Path | None:
    """`run.resume` -> the checkpoint to load, or None for a fresh start.

    never: fresh. auto: the latest complete checkpoint of this run, else fresh.
    A path: that checkpoint, which must exist and be complete.
    """
    if resume == "never":
        return None
    if resume == "auto":
        return latest_complete_checkpoint(checkpoints_dir)
    path = Path(resume).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"run.resume={resume}: no such checkpoint directory. "
            "Fix: give a checkpoint-N directory of a run, or run.resume=auto / never."
        )
    if not is_complete(path):
        raise ConfigError(
            f"run.resume={resume}: this checkpoint has no {COMPLETE_MARKER} marker, so its "
            "save may not have finished (e.g. a crash mid-save). Fix: pick an earlier "
            "checkpoint of the run, or run.resume=auto to take the latest complete one."
        )
    return path
