"""latest_complete_checkpoint on directories laid out like a run's checkpoints/ (fast: no
training; the slow resume tests use the real thing). The rules for run.resume=PATH are
validation's (tests/unit/test_validate.py)."""

from __future__ import annotations

from pathlib import Path

from launcher.rundir import COMPLETE_MARKER, write_complete_marker
from launcher.rundir.checkpoints import (
    checkpoint_world_size,
    latest_complete_checkpoint,
    list_checkpoints,
)


def make_checkpoint(root: Path, step: int, complete: bool) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text("{}")
    if complete:
        write_complete_marker(path, step, world_size=2)
    return path


def test_latest_complete_skips_newer_half_written(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 2, complete=True)
    four = make_checkpoint(tmp_path, 4, complete=True)
    make_checkpoint(tmp_path, 6, complete=False)
    assert latest_complete_checkpoint(tmp_path) == four


def test_steps_sort_numerically_not_as_text(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 9, complete=True)
    hundred = make_checkpoint(tmp_path, 100, complete=True)
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "runs").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-9", "checkpoint-100"]
    assert latest_complete_checkpoint(tmp_path) == hundred


def test_no_checkpoints_means_fresh_start(tmp_path: Path) -> None:
    assert latest_complete_checkpoint(tmp_path / "missing") is None
    make_checkpoint(tmp_path, 2, complete=False)
    assert latest_complete_checkpoint(tmp_path) is None


def test_marker_is_written_atomically(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, 3, complete=True)
    assert sorted(p.name for p in path.iterdir()) == [COMPLETE_MARKER, "trainer_state.json"]


def test_marker_records_the_world_size(tmp_path: Path) -> None:
    assert checkpoint_world_size(make_checkpoint(tmp_path, 4, complete=True)) == 2
    assert checkpoint_world_size(make_checkpoint(tmp_path, 6, complete=False)) is None
