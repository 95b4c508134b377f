"""SIGTERM and Ctrl-C lose nothing: `ftl train` signalled at a random step saves one
complete checkpoint at an agreed step boundary and exits 75 (stopped, resumable); the same
command again resumes at the next step, and the two launches' losses joined equal the
uninterrupted run's, one loss per step. A second Ctrl-C aborts at once. A SIGTERM that
reaches the ranks through torchrun (not through `ftl train`) stops them the same way.

The steps are slowed by an injected probe (SlowSteps) so that a signal can land at a chosen
step; the references are the uninterrupted runs test_train_strategies.py already trains.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from runs import (
    FAST_TRAIN,
    RUN_TIMES,
    Run,
    describe_failure,
    free_port,
    plan_run,
    project_env,
    train_losses,
)
from test_train_resume import MAX_STEPS
from test_train_strategies import run_name, strategy_overrides

from launcher.checkpoints import COMPLETE_MARKER, is_complete, list_checkpoints
from launcher.compose import PROJECT_ROOT
from launcher.planner import resolve_tool
from launcher.supervise import ABORTED_EXIT, STOPPED_EXIT

pytestmark = pytest.mark.slow

SLOW = "train.callbacks=[{_target_:tests.integration.probes.SlowSteps,seconds:0.5}]"
WAIT_S = 300


def start_in_session(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Its own session, as a terminal's foreground job is its own process group: the test
    signals that group and never itself."""
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=PROJECT_ROOT, env=project_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def ftl_train_argv(root: Path, name: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "launcher", "train", *FAST_TRAIN,
            f"cluster.master_port={free_port()}", f"run.output_dir={root}", f"run.name={name}",
            *overrides]


def run_dirs(root: Path, name: str) -> list[Path]:
    base = root / name
    if not base.is_dir():
        return []
    # Not the hidden staging dir a launch writes before renaming it into place.
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))


def wait_for_step(metrics: Callable[[], Path | None], step: int,
                  proc: subprocess.Popen[bytes]) -> None:
    """Until rank 0 has logged the loss of `step` (metrics.jsonl), or fail."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        path = metrics()
        if path is not None and path.is_file():
            for line in path.read_text().splitlines():
                record = json.loads(line) if line.strip() else {}
                if "loss" in record and record["step"] >= step:
                    return
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before step {step}"
        time.sleep(0.05)
    raise AssertionError(f"no loss for step {step} within {WAIT_S} s")


def stop_with_signal(root: Path, name: str, overrides: list[str], signum: signal.Signals,
                     at_step: int) -> tuple[Path, int]:
    """`ftl train` in its own session, `signum` to its process group once step `at_step`
    is logged; returns (run dir, exit status)."""
    root.mkdir(parents=True, exist_ok=True)
    proc = start_in_session(ftl_train_argv(root, name, overrides), root / f"{name}-1.log")
    latest = lambda: (run_dirs(root, name) or [None])[-1]  # noqa: E731
    try:
        wait_for_step(lambda: latest() and latest() / "metrics.jsonl", at_step, proc)
        os.killpg(proc.pid, signum)
        returncode = proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    run_dir = latest()
    assert run_dir is not None
    return run_dir, returncode


def check_stopped_at_a_boundary(run_dir: Path, returncode: int, at_step: int, log: Path) -> int:
    """The stop's evidence: exit 75, RUN_DIR/preempted names a step after the signal, whose
    checkpoint is complete; that launch logged every step up to it once. Returns the step."""
    assert returncode == STOPPED_EXIT, f"rc={returncode}\n{log.read_text()[-4000:]}"
    stop_step = json.loads((run_dir / "preempted").read_text())["step"]
    assert at_step <= stop_step < MAX_STEPS, (at_step, stop_step)
    checkpoint = run_dir / "checkpoints" / f"checkpoint-{stop_step}"
    assert is_complete(checkpoint)
    # written once the checkpoint was complete, never before (a kill in the save)
    marker = checkpoint / COMPLETE_MARKER
    assert (run_dir / "preempted").stat().st_mtime >= marker.stat().st_mtime
    assert not (run_dir / "result.json").exists()
    assert sorted(train_losses(run_dir)) == list(range(1, stop_step + 1))
    return stop_step


CASES = [("ddp", "torchrun", signal.SIGTERM), ("zero2", "deepspeed", signal.SIGTERM),
         ("zero3", "torchrun", signal.SIGTERM), ("fsdp", "torchrun", signal.SIGTERM),
         ("ddp", "torchrun", signal.SIGINT)]


@pytest.mark.parametrize(("strategy", "launcher", "signum"), CASES,
                         ids=[f"{s}-{la}-{sig.name}" for s, la, sig in CASES])
def test_a_signal_saves_at_a_step_boundary_and_the_same_command_resumes_exactly(
    trained: Callable[..., Run], runs_root: Path, strategy: str, launcher: str,
    signum: signal.Signals,
) -> None:
    overrides = strategy_overrides(strategy, launcher, "fp32")
    reference = trained(run_name(strategy, launcher, "fp32"), overrides)
    assert reference.returncode == 0, describe_failure(reference)

    root, name = runs_root / "signals", f"{signum.name.lower()}-{strategy}"
    mine = [f"strategy={strategy}", f"cluster.launcher={launcher}", "precision=fp32", SLOW]
    at_step = random.randint(2, 5)  # leaves room for the vote before the last step (8)
    started = time.monotonic()
    first_dir, returncode = stop_with_signal(root, name, mine, signum, at_step)
    stop_step = check_stopped_at_a_boundary(first_dir, returncode, at_step,
                                            root / f"{name}-1.log")

    again = subprocess.run(ftl_train_argv(root, name, mine), cwd=PROJECT_ROOT,
                           env=project_env(), capture_output=True, text=True, timeout=WAIT_S)
    RUN_TIMES[f"{name} (signal+resume)"] = time.monotonic() - started
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    second_dir = run_dirs(root, name)[-1]
    assert second_dir != first_dir
    checkpoint = first_dir / "checkpoints" / f"checkpoint-{stop_step}"
    (launch_record,) = [json.loads(line) for line in
                        (second_dir / "launches.jsonl").read_text().splitlines()]
    assert launch_record["resumed_from"] == str(checkpoint)
    assert launch_record["start_step"] == stop_step

    first, second = train_losses(first_dir), train_losses(second_dir)
    assert min(second) == stop_step + 1, (stop_step, sorted(second))
    joined = {**first, **second}
    assert sorted(joined) == list(range(1, MAX_STEPS + 1))
    assert len(first) + len(second) == MAX_STEPS  # exactly one loss per step
    expected = reference.train_losses()
    for step, loss in joined.items():
        assert loss == pytest.approx(expected[step], rel=1e-5, abs=1e-6), (step, joined, expected)


def test_a_second_ctrl_c_aborts_at_once(runs_root: Path) -> None:
    root, name = runs_root / "signals", "abort"
    root.mkdir(parents=True, exist_ok=True)
    slower = SLOW.replace("seconds:0.5", "seconds:5")  # no step boundary within the test
    log = root / f"{name}.log"
    proc = start_in_session(ftl_train_argv(root, name, ["strategy=ddp", slower]), log)
    try:
        wait_for_step(lambda: (run_dirs(root, name) or [None])[-1] and
                      run_dirs(root, name)[-1] / "metrics.jsonl", 1, proc)
        ranks = psutil.Process(proc.pid).children(recursive=True)
        assert len(ranks) >= 3, ranks  # the launcher and its 2 ranks
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        returncode = proc.wait(timeout=30)  # at once: not after the 5 s step and a save
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert returncode == ABORTED_EXIT, log.read_text()[-3000:]
    gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive, f"still running after the abort: {alive}"
    # The ranks agreed to stop at step 2 and were killed in its 5 s step end, before the
    # save: a graceful stop instead of the abort would have completed checkpoint-2.
    run_dir = run_dirs(root, name)[-1]
    assert not [c for c in list_checkpoints(run_dir / "checkpoints") if is_complete(c)]
    assert "aborting" in log.read_text()


def test_sigterm_through_torchrun_reaches_the_ranks_and_they_save(runs_root: Path) -> None:
    """No `ftl train` in between: torchrun forwards its SIGTERM to the ranks (30 s before
    it kills them); the ranks' own handlers turn it into the same agreed stop."""
    prepared = plan_run(runs_root / "signals", "torchrun-term", ["strategy=ddp", SLOW])
    log = prepared.run_dir / "launcher-output.txt"
    env = {**project_env(), **prepared.launch.env}
    with log.open("wb") as out:
        proc = subprocess.Popen(resolve_tool(prepared.launch.argv), cwd=PROJECT_ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_step(lambda: prepared.run_dir / "metrics.jsonl", 2, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=WAIT_S)  # torchrun itself exits non-zero after a signal
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    preempted = json.loads((prepared.run_dir / "preempted").read_text())
    assert preempted["reason"] == "SIGTERM", preempted
    assert is_complete(prepared.run_dir / "checkpoints" / f"checkpoint-{preempted['step']}")
    # A batch script whose shell saw nothing still finds the request and requeues.
    assert (prepared.run_dir / "preempt.requested").exists()
    assert sorted(train_losses(prepared.run_dir)) == list(range(1, preempted["step"] + 1))


def test_kill_9_of_ftl_train_still_stops_the_ranks_with_a_checkpoint(runs_root: Path) -> None:
    """`ftl train` dies at once (SIGKILL: no handler runs): the kernel's parent-death signal
    (SIGTERM) reaches its launcher, which forwards it; the ranks save and every process of
    the run exits. Without it the launcher, in a session of its own, trains on orphaned."""
    root, name = runs_root / "signals", "kill-9"
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{name}.log"
    proc = start_in_session(ftl_train_argv(root, name, ["strategy=ddp", SLOW]), log)
    latest = lambda: (run_dirs(root, name) or [None])[-1]  # noqa: E731
    tree: list[psutil.Process] = []
    try:
        wait_for_step(lambda: latest() and latest() / "metrics.jsonl", 2, proc)
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 3, tree  # the launcher and its 2 ranks
        proc.kill()
        proc.wait(timeout=10)
        gone, alive = psutil.wait_procs(tree, timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        for process in tree:  # re-parented once ftl train is gone: not our children now
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    assert not alive, f"still running after ftl train died: {alive}"
    run_dir = latest()
    preempted = json.loads((run_dir / "preempted").read_text())
    assert preempted["reason"] == "SIGTERM", preempted
    assert 2 <= preempted["step"] < MAX_STEPS, preempted
    assert is_complete(run_dir / "checkpoints" / f"checkpoint-{preempted['step']}")
    assert sorted(train_losses(run_dir)) == list(range(1, preempted["step"] + 1))
