"""run.resume=auto across launches of one run name: the newest unfinished launch's last
complete checkpoint; a finished launch ends the search."""

from __future__ import annotations

from pathlib import Path

from launcher.rundir import RunDir, write_complete_marker
from launcher.rundir.checkpoints import checkpoint_to_load, latest_in_earlier_runs


def checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    path = run / "checkpoints" / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        write_complete_marker(path, step, world_size=2)
    return path


def test_newest_unfinished_launch_wins(tmp_path: Path) -> None:
    checkpoint(tmp_path / "20260101-000000", 4)
    wanted = checkpoint(tmp_path / "20260102-000000", 6)
    checkpoint(tmp_path / "20260102-000000", 8, complete=False)  # half-written
    (tmp_path / "20260103-000000").mkdir()  # a plan-only run dir, no checkpoints
    assert latest_in_earlier_runs(tmp_path) == wanted


def test_a_finished_launch_ends_the_search(tmp_path: Path) -> None:
    checkpoint(tmp_path / "20260101-000000", 4)
    finished = tmp_path / "20260102-000000"
    checkpoint(finished, 8)
    (finished / "result.json").write_text("{}")
    assert latest_in_earlier_runs(tmp_path) is None


def test_own_checkpoints_come_before_the_recorded_earlier_one(tmp_path: Path) -> None:
    earlier = checkpoint(tmp_path / "20260101-000000", 4)
    run = tmp_path / "20260102-000000"
    run.mkdir()
    RunDir(run).resume_from.write_text(f"{earlier}\n")
    assert checkpoint_to_load("auto", RunDir(run)) == earlier
    own = checkpoint(run, 6)  # e.g. a requeued Slurm job saved since
    assert checkpoint_to_load("auto", RunDir(run)) == own
    assert checkpoint_to_load(str(earlier), RunDir(run)) == own  # a requeue keeps going
    assert checkpoint_to_load("never", RunDir(run)) is None
