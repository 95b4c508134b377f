"""Resume: a run stopped right after step 4's checkpoint, relaunched with run.resume=auto,
must log exactly the losses of the uninterrupted run for steps 5..8, and must skip a
half-written checkpoint that looks newer. Also: a failing rank leaves logs/rank<R>.error.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import RUN_TIMES
from runs import Run, describe_failure, launch, train
from test_train_strategies import run_name, strategy_overrides

from launcher.callbacks import STOP_AFTER_STEP_ENV
from launcher.checkpoints import COMPLETE_MARKER, is_complete, list_checkpoints

pytestmark = pytest.mark.slow

STOP_STEP, MAX_STEPS = 4, 8


def fake_half_written_checkpoint(checkpoints: Path, source: str, name: str) -> Path:
    """What a crash mid-save leaves: a newer checkpoint dir without the marker and with a
    file missing. Loading it would break resume (no trainer state / weights)."""
    half = checkpoints / name
    shutil.copytree(checkpoints / source, half)
    (half / COMPLETE_MARKER).unlink()
    (half / "trainer_state.json").unlink()
    return half


@pytest.mark.parametrize(
    ("strategy", "launcher"),
    [("ddp", "torchrun"), ("zero3", "torchrun"), ("zero2", "deepspeed"), ("fsdp", "torchrun")],
)
def test_resume_continues_exactly_and_skips_half_written_checkpoint(
    trained: Callable[..., Run], runs_root: Path, strategy: str, launcher: str
) -> None:
    overrides = strategy_overrides(strategy, launcher, "fp32")
    reference = trained(run_name(strategy, launcher, "fp32"), overrides)
    assert reference.returncode == 0, describe_failure(reference)

    run_dir = runs_root / f"resume-{strategy}-{launcher}"
    stopped = train(run_dir, overrides, {STOP_AFTER_STEP_ENV: str(STOP_STEP)})
    assert stopped.returncode == 0, describe_failure(stopped)
    checkpoints = run_dir / "checkpoints"
    assert [p.name for p in list_checkpoints(checkpoints)] == [f"checkpoint-{STOP_STEP}"]
    assert is_complete(checkpoints / f"checkpoint-{STOP_STEP}")
    # A stopped run is not finished: no final model or result until the resumed run ends.
    assert not (run_dir / "result.json").exists()
    assert not (run_dir / "model").exists()
    half = fake_half_written_checkpoint(checkpoints, f"checkpoint-{STOP_STEP}", "checkpoint-6")

    resumed = launch(run_dir)  # the run dir's config says run.resume=auto
    RUN_TIMES[f"resume-{strategy}-{launcher} (stop+resume)"] = stopped.seconds + resumed.seconds
    assert resumed.returncode == 0, describe_failure(resumed)
    result = resumed.result
    assert result["resumed_from"] == str(checkpoints / f"checkpoint-{STOP_STEP}")
    assert result["global_step"] == MAX_STEPS
    assert not is_complete(half)

    expected = reference.train_losses()
    got = resumed.train_losses()  # steps 1..4 from the stopped run, 5..8 after resuming
    assert sorted(got) == list(range(1, MAX_STEPS + 1))
    for step in range(STOP_STEP + 1, MAX_STEPS + 1):
        assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), (step, got, expected)


def test_failing_rank_writes_its_traceback(runs_root: Path) -> None:
    run = train(runs_root / "broken", ["strategy=ddp", "dataset.eval_path=/nonexistent.jsonl"])
    assert run.returncode != 0
    # Both ranks fail; the launcher may kill the slower one before it writes its file.
    errors = sorted((run.run_dir / "logs").glob("rank*.error"))
    assert errors and {e.name for e in errors} <= {"rank0.error", "rank1.error"}
    for error in errors:
        text = error.read_text()
        assert "Traceback" in text and "nonexistent.jsonl" in text
    assert not (run.run_dir / "result.json").exists()
