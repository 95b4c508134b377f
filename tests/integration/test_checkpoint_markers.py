"""latest_complete_checkpoint / resolve_resume on directories laid out like a run's
checkpoints/ (fast: no training; the slow resume tests use the real thing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.checkpoints import (
    COMPLETE_MARKER,
    check_resume_world_size,
    checkpoint_world_size,
    latest_complete_checkpoint,
    list_checkpoints,
    resolve_resume,
    write_complete_marker,
)
from launcher.errors import ConfigError


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
    assert resolve_resume("auto", tmp_path) is None


def test_resume_modes(tmp_path: Path) -> None:
    two = make_checkpoint(tmp_path, 2, complete=True)
    assert resolve_resume("never", tmp_path) is None
    assert resolve_resume("auto", tmp_path) == two
    assert resolve_resume(str(two), tmp_path) == two


def test_explicit_path_must_exist_and_be_complete(tmp_path: Path) -> None:
    half = make_checkpoint(tmp_path, 2, complete=False)
    with pytest.raises(ConfigError, match=f"run.resume=.*{COMPLETE_MARKER}"):
        resolve_resume(str(half), tmp_path)
    with pytest.raises(ConfigError, match="no such checkpoint directory"):
        resolve_resume(str(tmp_path / "checkpoint-99"), tmp_path)


def test_marker_is_written_atomically(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, 3, complete=True)
    assert sorted(p.name for p in path.iterdir()) == [COMPLETE_MARKER, "trainer_state.json"]


def test_deepspeed_resume_on_another_world_size_is_refused(tmp_path: Path) -> None:
    checkpoint = make_checkpoint(tmp_path, 4, complete=True)  # written by 2 ranks
    assert checkpoint_world_size(checkpoint) == 2
    check_resume_world_size(checkpoint, 2, "deepspeed")
    check_resume_world_size(checkpoint, 4, "ddp")  # DDP state is not partitioned
    with pytest.raises(ConfigError, match="written by 2 ranks, this run has 4"):
        check_resume_world_size(checkpoint, 4, "deepspeed")
