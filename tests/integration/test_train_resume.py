"""Resume, told apart from a restart: a run stopped right after step 4's checkpoint
(StopAfterStep, injected), then launched again with the same command (run.resume=auto),
must log each step's loss exactly once across the two launches, start its second launch at
step 5, equal the uninterrupted run's losses for steps 5..8, and skip a half-written
checkpoint that looks newer. Also: a failing rank leaves logs/rank<R>.error.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from runs import RUN_TIMES, Run, callbacks, describe_failure, launch, plan_run, train
from test_train_strategies import NO_GATHER, run_name, strategy_overrides

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


CASES = [
    ("ddp", "torchrun", ()),
    ("zero3", "torchrun", ()),
    ("zero2", "deepspeed", ()),
    ("fsdp", "torchrun", ()),
    ("fsdp", "torchrun", NO_GATHER),  # sharded (torch.distributed.checkpoint) checkpoints
]


@pytest.mark.parametrize(
    ("strategy", "launcher", "extra"), CASES, ids=[run_name(s, la, "fp32", e) for s, la, e in CASES]
)
def test_second_launch_resumes_at_the_next_step_and_skips_a_half_written_checkpoint(
    trained: Callable[..., Run], runs_root: Path, strategy: str, launcher: str,
    extra: tuple[str, ...],
) -> None:
    overrides = strategy_overrides(strategy, launcher, "fp32", extra)
    reference = trained(run_name(strategy, launcher, "fp32", extra), overrides)
    assert reference.returncode == 0, describe_failure(reference)

    name = f"resume-{run_name(strategy, launcher, 'fp32', extra)}"
    stopped = train(runs_root, name, [*overrides, callbacks(stop=STOP_STEP)])
    assert stopped.returncode == 0, describe_failure(stopped)
    checkpoints = stopped.run_dir / "checkpoints"
    assert [p.name for p in list_checkpoints(checkpoints)] == [f"checkpoint-{STOP_STEP}"]
    assert is_complete(checkpoints / f"checkpoint-{STOP_STEP}")
    # A stopped run is not finished: no final model or result.
    assert not (stopped.run_dir / "result.json").exists()
    assert not (stopped.run_dir / "model").exists()
    half = fake_half_written_checkpoint(checkpoints, f"checkpoint-{STOP_STEP}", "checkpoint-6")

    # The same command again: validation finds the earlier launch's last complete checkpoint.
    prepared = plan_run(runs_root, name, overrides)
    wanted = checkpoints / f"checkpoint-{STOP_STEP}"
    assert prepared.plan.resume_from == wanted
    resumed = launch(prepared)
    RUN_TIMES[f"{name} (stop+resume)"] = stopped.seconds + resumed.seconds
    assert resumed.returncode == 0, describe_failure(resumed)
    assert not is_complete(half)

    (launch_record,) = resumed.launches()
    assert launch_record["resumed_from"] == str(wanted)
    assert launch_record["start_step"] == STOP_STEP
    result = resumed.result
    assert result["resumed_from"] == str(wanted) and result["start_step"] == STOP_STEP
    assert result["global_step"] == MAX_STEPS

    # Exactly one loss per step across the launches: a restart from step 0 would log
    # steps 1..8 again in the second launch.
    first, second = stopped.train_losses(), resumed.train_losses()
    assert sorted(first) == list(range(1, STOP_STEP + 1))
    assert sorted(second) == list(range(STOP_STEP + 1, MAX_STEPS + 1))
    # A resumed launch does not evaluate "at the start" again.
    assert [m["step"] for m in resumed.metrics() if "eval_loss" in m] == [MAX_STEPS]
    expected = reference.train_losses()
    for step in second:
        assert second[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), (
            step, second, expected)


def test_failing_rank_writes_its_traceback(runs_root: Path) -> None:
    # Bad data no longer reaches the ranks (validation scans every row), so the failure is
    # injected: every rank raises at the end of step 2.
    failing = "train.callbacks=[{_target_:tests.integration.probes.FailAtStep,step:2}]"
    run = train(runs_root, "broken", ["strategy=ddp", failing])
    assert run.returncode != 0
    # Both ranks fail; the launcher may kill the slower one before it writes its file.
    errors = sorted((run.run_dir / "logs").glob("rank*.error"))
    assert errors and {e.name for e in errors} <= {"rank0.error", "rank1.error"}
    for error in errors:
        text = error.read_text()
        assert "Traceback" in text and "injected failure at step 2" in text
    assert not (run.run_dir / "result.json").exists()
