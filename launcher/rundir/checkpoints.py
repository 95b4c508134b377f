"""Which checkpoint a run resumes from and what makes one complete: its COMPLETE marker,
written by rank 0 once every rank has written its part (rank/callbacks/checkpoint_marker.py).

Both sides of the run dir read this: the launcher (validation, `ftl status`, the Slurm
job's resume) and the ranks (what to load). No torch import.
"""

from __future__ import annotations

import re
from pathlib import Path

from launcher.rundir import COMPLETE_MARKER, RunDir, read_complete_marker


def checkpoint_step(path: Path) -> int | None:
    """N for a directory named checkpoint-N, else None."""
    match = re.match(r"checkpoint-(\d+)$", path.name)
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


def checkpoint_world_size(checkpoint: Path) -> int | None:
    """The number of ranks that wrote `checkpoint` (from its COMPLETE marker)."""
    marker = read_complete_marker(checkpoint)
    return marker.world_size if marker else None


def latest_in_earlier_runs(run_root: Path) -> Path | None:
    """What run.resume=auto continues: the newest complete checkpoint of earlier launches of
    a run name (outputs/<run.name>/<timestamp>, newest first); a finished launch (its
    result.json) ends the search, so the same command then trains anew."""
    if not run_root.is_dir():
        return None
    runs = sorted((p for p in run_root.iterdir() if p.is_dir()), reverse=True)
    for run in (RunDir(path) for path in runs):
        if run.result.exists():
            return None
        found = latest_complete_checkpoint(run.checkpoints)
        if found is not None:
            return found
    return None


def checkpoint_to_load(resume: str, run_dir: RunDir) -> Path | None:
    """What a rank loads: its own run dir's newest complete checkpoint (a requeued job's),
    else the one the launcher chose and validated (RUN_DIR/resume_from)."""
    if resume == "never":
        return None
    own = latest_complete_checkpoint(run_dir.checkpoints)
    if own is not None or not run_dir.resume_from.is_file():
        return own
    recorded = Path(run_dir.resume_from.read_text().strip())
    return recorded if is_complete(recorded) else None
