"""SIGTERM, Ctrl-C and kill -9 lose nothing, and resume is told apart from a restart: `ftl
train` signalled at a random step saves one complete checkpoint at an agreed step boundary
and exits 75 (stopped, resumable, no final model or result); a half-written checkpoint
that looks newer is planted; the same command again skips it, resumes at the next step
without evaluating "at the start" again, and the two launches' losses joined equal the
uninterrupted run's, one loss per step. In `make test`: Ctrl-C of an objective=dpo run
under ddp (torchrun) with activation checkpointing (which must change no number; DPO's
reference is rebuilt on resume), and kill -9 of `ftl train` (no handler runs in it) under
ZeRO-2 (DeepSpeed's engine and launcher) and under FSDP2 with sharded checkpoints
(torch.distributed.checkpoint), this one on the tiny mixture of experts (its router's loss
joined in each step's loss): the collective saves of the strategies Slurm users preempt
most. After the kill every process of the run exits and the ranks save all the same: under
torchrun through the launcher's parent-death SIGTERM, which torchrun forwards (the path of
a SIGTERM that reaches the ranks through torchrun alone, where their own handlers turn it
into the agreed stop and leave RUN_DIR/preempt.requested for a batch script whose shell
saw nothing); the deepspeed launcher's runner dies of it without passing it on, and its
ranks see that `ftl train` is gone (FTL_SUPERVISOR). `make test-full` adds SIGTERM to `ftl
train` under ddp, ZeRO-2, FSDP and ZeRO-3 (on the MoE) and the Ctrl-C case on SFT
(FULL_CASES). The ddp Ctrl-C case also logs to every tracker (wandb offline, MLflow's file
store in tmp): one tracker run across the stop and the resume, MLflow's params and each
step's loss once, and no credential from the environment in any file.
A second Ctrl-C aborts at once.

The first launch's steps are slowed by an injected probe (SlowSteps) so that a signal can
land at a chosen step (the resume runs without it); the references are the uninterrupted
runs test_train_strategies.py already trains (FSDP's sharded and gathered saves train
alike, so one reference serves both). The FSDP stop is shared: its checkpoint is also the
first link of test_world_size_change.py's fsdp-sharded-2to1 chain (signal_stop caches the
stopped launch per session), which then needs no 2-rank launch of its own."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from runs import (
    FAST_TRAIN,
    RUN_TIMES,
    Run,
    assert_router_loss_logged,
    describe_failure,
    free_port,
    jsonl,
    plan_run,
    project_env,
    train_losses,
)
from test_train_strategies import NO_GATHER, model_overrides, run_name, strategy_overrides

from launcher.config.compose import PROJECT_ROOT
from launcher.launchers.supervisor import SUPERVISOR_GONE
from launcher.rundir import ABORTED_EXIT, COMPLETE_MARKER, STOPPED_EXIT
from launcher.rundir.checkpoints import is_complete, list_checkpoints

pytestmark = pytest.mark.slow

# Every step slow, from the first: the ranks vote about once a second, at an interval
# measured from their recent steps (launcher/rank/preempt.py), so fast early steps would
# put the next vote past the last step.
SLOW = "train.callbacks=[{_target_:tests.integration.probes.SlowSteps,seconds:0.5}]"
SLOW_WRAPPER = ("train.callbacks=[{_target_:tests.integration.probes.SlowSteps,seconds:0.5},"
                "{_target_:tests.integration.probes.WrapperProbe}]")
WAIT_S = 300
MAX_STEPS = 8


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
    wait_for_record(metrics, proc, f"the loss of step {step}",
                    lambda record: "loss" in record and record["step"] >= step)


def wait_for_record(metrics: Callable[[], Path | None], proc: subprocess.Popen[bytes],
                    what: str, matches: Callable[[dict], bool]) -> None:
    """Until rank 0 has written a metrics.jsonl record that `matches`, or fail."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        path = metrics()
        if path is not None and path.is_file():
            for line in path.read_text().splitlines():
                if matches(json.loads(line) if line.strip() else {}):
                    return
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {what}"
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {WAIT_S} s")


KILL = signal.SIGKILL
"""A case's stop by kill -9 of `ftl train` alone (no handler runs in it): the ranks stop by
themselves, through the launcher's parent-death SIGTERM that torchrun forwards, or, under
the deepspeed launcher, whose runner dies of it without passing it on, because they see
that `ftl train` is gone (FTL_SUPERVISOR)."""
KILLED_REASON = {"torchrun": "SIGTERM", "deepspeed": SUPERVISOR_GONE}
"""The reason RUN_DIR/preempted records after a kill -9 of `ftl train`, by launcher."""


def stop_with_signal(root: Path, name: str, overrides: list[str], signum: signal.Signals,
                     at_step: int) -> tuple[Path, int]:
    """`ftl train` in its own session, `signum` to its process group once step `at_step`
    is logged (KILL: to `ftl train` alone, then every process of the run must exit);
    returns (run dir, exit status)."""
    root.mkdir(parents=True, exist_ok=True)
    proc = start_in_session(ftl_train_argv(root, name, overrides), root / f"{name}-1.log")
    latest = lambda: (run_dirs(root, name) or [None])[-1]  # noqa: E731
    tree: list[psutil.Process] = []
    try:
        wait_for_step(lambda: latest() and latest() / "metrics.jsonl", at_step, proc)
        if signum is KILL:
            tree = psutil.Process(proc.pid).children(recursive=True)
            assert len(tree) >= 3, tree  # the launcher and its 2 ranks
            proc.kill()
            returncode = proc.wait(timeout=10)
            gone, alive = psutil.wait_procs(tree, timeout=WAIT_S)
            # Without the parent-death signal the launcher, in a session of its own, and
            # its ranks train on, orphaned.
            assert not alive, f"still running after ftl train died: {alive}"
        else:
            os.killpg(proc.pid, signum)
            returncode = proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for process in tree:  # re-parented once ftl train is gone: not our children now
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    run_dir = latest()
    assert run_dir is not None
    return run_dir, returncode


def check_stopped_at_a_boundary(stop: SignalStop) -> int:
    """The stop's evidence: exit 75 (after a kill -9 of `ftl train`: its -9, the reason
    the ranks stopped for and the request they left for a batch script), RUN_DIR/preempted
    names a step after the signal, whose checkpoint is complete; that launch logged every
    step up to it once. Returns the step."""
    run_dir, log = stop.run_dir, stop.log
    preempted = json.loads((run_dir / "preempted").read_text())
    if stop.signum is KILL:
        assert stop.returncode == -KILL, stop.returncode
        assert preempted["reason"] == KILLED_REASON[stop.launcher], preempted
        # a batch script whose shell saw nothing still finds the request and requeues
        assert (run_dir / "preempt.requested").exists()
    else:
        assert stop.returncode == STOPPED_EXIT, f"rc={stop.returncode}\n{log.read_text()[-4000:]}"
        assert "stopped before the last step" in log.read_text()
    stop_step = preempted["step"]
    assert stop.at_step <= stop_step < MAX_STEPS, (stop.at_step, stop_step)
    checkpoint = run_dir / "checkpoints" / f"checkpoint-{stop_step}"
    assert is_complete(checkpoint)
    # written once the checkpoint was complete, never before (a kill in the save)
    marker = checkpoint / COMPLETE_MARKER
    assert (run_dir / "preempted").stat().st_mtime >= marker.stat().st_mtime
    assert not (run_dir / "result.json").exists() and not (run_dir / "model").exists()
    assert sorted(train_losses(run_dir)) == list(range(1, stop_step + 1))
    return stop_step


def plant_half_written_checkpoint(checkpoints: Path, source: str, name: str) -> Path:
    """What a crash mid-save leaves: a newer checkpoint dir without the marker and with a
    file missing. Loading it would break resume (no trainer state / weights)."""
    half = checkpoints / name
    shutil.copytree(checkpoints / source, half)
    (half / COMPLETE_MARKER).unlink()
    (half / "trainer_state.json").unlink()
    return half


CHECKPOINTED = ("train.gradient_checkpointing=true",)
DPO = ("objective=dpo",)
TRACKED_CASE = ("ddp", "torchrun", signal.SIGINT, (*CHECKPOINTED, *DPO))
"""Also objective=dpo: its reference model is rebuilt on resume, and the losses must still
join into the uninterrupted DPO run's (test_dpo.py's ddp run)."""
FSDP_SHARDED_CASE = ("fsdp", "torchrun", KILL, NO_GATHER)
"""Also test_world_size_change.py's first link of fsdp-sharded-2to1 (signal_stop)."""
CASES = [("zero2", "deepspeed", KILL, ()), TRACKED_CASE, FSDP_SHARDED_CASE]
"""Each way a stop reaches the ranks once: `ftl train`'s own handler (the ddp Ctrl-C, whose
request file every launcher's ranks read), and a kill -9 of `ftl train` under each
launcher (FSDP under torchrun, ZeRO-2 under DeepSpeed's), each with its engine's
collective save."""
FULL_CASES = [("ddp", "torchrun", signal.SIGTERM, ()),
              ("ddp", "torchrun", signal.SIGINT, CHECKPOINTED),
              ("zero2", "deepspeed", signal.SIGTERM, ()),
              ("fsdp", "torchrun", signal.SIGTERM, NO_GATHER),
              ("zero3", "torchrun", signal.SIGTERM, ())]
"""`make test-full` only, since `make test` proves what it does: `ftl train` and the ranks
handle SIGTERM and SIGINT alike (supervise.STOP_SIGNALS, preempt.STOP_SIGNALS), the stop
request's path is the same file under every launcher and engine, and ddp's save is the one
the Ctrl-C case makes. ZeRO-3's stop is DeepSpeed's, as zero2's case here; its exact resume
is test_sequence_parallel.py's (zero3 with parallel.sp=2) and, on the MoE,
test_world_size_change.py's zero3 chain."""


@dataclass(frozen=True)
class SignalStop:
    """The first launch of a case: `ftl train` signalled once step `at_step` was logged."""
    root: Path
    name: str
    launcher: str
    signum: signal.Signals
    run_dir: Path
    returncode: int
    at_step: int
    seconds: float

    @property
    def log(self) -> Path:
        return self.root / f"{self.name}-1.log"


_STOPS: dict[tuple[Path, str], SignalStop] = {}


def case_overrides(strategy: str, launcher: str, extra: tuple[str, ...]) -> list[str]:
    """A case's own `ftl train` overrides: the resume's command (the stop adds SLOW); the
    model of its reference (test_train_strategies.MOE_RUNS: zero3's and fsdp's the MoE)."""
    return [f"strategy={strategy}", f"cluster.launcher={launcher}", "precision=fp32",
            *model_overrides(strategy, launcher, "fp32", extra), *extra]


def signal_stop(runs_root: Path, strategy: str, launcher: str, signum: signal.Signals,
                extra: tuple[str, ...] = (), more: tuple[str, ...] = ()) -> SignalStop:
    """The case's signalled launch, once per session (another test may start from its
    checkpoint: test_world_size_change.py). `more`: overrides of the stop and its resume
    that do not name the case (the trackers); a tracked case sets its environment first."""
    root, name = runs_root / "signals", run_name(strategy, launcher, signum.name, extra)
    if (root, name) not in _STOPS:
        # Slow steps only where the signal lands: the resume is the same command without.
        slowed = [*case_overrides(strategy, launcher, extra), *more,
                  SLOW_WRAPPER if CHECKPOINTED[0] in extra else SLOW]
        at_step = random.randint(2, 5)  # leaves room for the vote before the last step (8)
        started = time.monotonic()
        run_dir, returncode = stop_with_signal(root, name, slowed, signum, at_step)
        _STOPS[root, name] = SignalStop(root, name, launcher, signum, run_dir, returncode,
                                        at_step, time.monotonic() - started)
    return _STOPS[root, name]


TRACKERS = "train.report_to=[tensorboard,wandb,mlflow]"
EVAL_AFTER = ["eval.tasks=[arith]", "eval.limit=4"]
SECRETS = {"WANDB_API_KEY": "wandb-s3cr3t-key-never-written",
           "MLFLOW_TRACKING_PASSWORD": "mlflow-s3cr3t-never-written"}


def track_everything(monkeypatch: pytest.MonkeyPatch, store: Path) -> str:
    """wandb offline (its files in each run dir), MLflow in a file store in tmp, and
    credentials in the environment that must never reach a file; returns the store URI.
    The test's own environment: validation runs here, and the launches inherit it."""
    uri = f"file://{store}"
    settings = {"WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": uri,
                # MLflow 3 refuses a file store unless told (the sqlite default costs a
                # ~10 s schema migration on 2 cores: docs/evidence/stack.md)
                "MLFLOW_ALLOW_FILE_STORE": "true", **SECRETS}
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_DIR", "WANDB_RUN_ID", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(key, raising=False)
    # Every process's temp dir: what the ranks leave there is checked (no_wandb_staging_left).
    (store.parent / TMP).mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(store.parent / TMP))
    return uri


TMP = "tracked-tmp"


def no_wandb_staging_left(tmp: Path) -> None:
    """wandb's import-time staging dirs are removed by the ranks, whose os._exit skips
    wandb's atexit cleanup (launcher/rank/tracker_runs.py, remove_wandb_staging)."""
    assert not sorted(p.name for p in tmp.glob("*wandb-*")), sorted(tmp.iterdir())


@pytest.mark.parametrize(("strategy", "launcher", "signum", "extra"), [
    pytest.param(*c, id=run_name(c[0], c[1], c[2].name, c[3]),
                 marks=[pytest.mark.full] if c in FULL_CASES else []) for c in CASES + FULL_CASES])
def test_a_signal_saves_at_a_step_boundary_and_the_same_command_resumes_exactly(
    trained: Callable[..., Run], runs_root: Path, strategy: str, launcher: str,
    signum: signal.Signals, extra: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
) -> None:
    objective = tuple(e for e in extra if e in DPO)  # the uninterrupted run of its objective
    reference = trained(run_name(strategy, launcher, "fp32", objective),
                        strategy_overrides(strategy, launcher, "fp32", objective))
    assert reference.returncode == 0, describe_failure(reference)

    root, name = runs_root / "signals", run_name(strategy, launcher, signum.name, extra)
    mine = case_overrides(strategy, launcher, extra)
    tracked = (strategy, launcher, signum, extra) == TRACKED_CASE
    if tracked:
        store = track_everything(monkeypatch, root / f"{name}-mlruns")
        mine.append(TRACKERS)
    stop = signal_stop(runs_root, strategy, launcher, signum, extra,
                       (TRACKERS,) if tracked else ())
    if tracked:  # the resumed launch evaluates once finished: scores into the same runs
        mine += EVAL_AFTER
    first_dir = stop.run_dir
    stop_step = check_stopped_at_a_boundary(stop)
    half = plant_half_written_checkpoint(first_dir / "checkpoints", f"checkpoint-{stop_step}",
                                         f"checkpoint-{stop_step + 1}")

    started = time.monotonic()
    again = subprocess.run(ftl_train_argv(root, name, mine), cwd=PROJECT_ROOT,
                           env=project_env(), capture_output=True, text=True, timeout=WAIT_S)
    RUN_TIMES[f"{name} (signal+resume)"] = stop.seconds + time.monotonic() - started
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    second_dir = run_dirs(root, name)[-1]
    assert second_dir != first_dir and not is_complete(half)
    checkpoint = first_dir / "checkpoints" / f"checkpoint-{stop_step}"
    (launch_record,) = jsonl(second_dir / "launches.jsonl")
    assert launch_record["resumed_from"] == str(checkpoint)
    assert launch_record["start_step"] == stop_step
    result = json.loads((second_dir / "result.json").read_text())
    assert result["resumed_from"] == str(checkpoint) and result["start_step"] == stop_step
    assert result["global_step"] == MAX_STEPS
    assert (second_dir / "resume_from").read_text().strip() == str(checkpoint)
    # The run finished: the same command again trains anew (validation, no launch needed).
    assert plan_run(root, name, mine).plan.resume_from is None
    # A resumed launch does not evaluate "at the start" again.
    second_metrics = jsonl(second_dir / "metrics.jsonl")
    assert [m["step"] for m in second_metrics if "eval_loss" in m] == [MAX_STEPS]

    # Exactly one loss per step across the launches: a restart from step 0 would log
    # steps 1..8 again in the second launch.
    first, second = train_losses(first_dir), train_losses(second_dir)
    assert min(second) == stop_step + 1, (stop_step, sorted(second))
    joined = {**first, **second}
    assert sorted(joined) == list(range(1, MAX_STEPS + 1))
    assert len(first) + len(second) == MAX_STEPS  # exactly one loss per step
    expected = reference.train_losses()
    for step, loss in joined.items():
        assert loss == pytest.approx(expected[step], rel=1e-5, abs=1e-6), (step, joined, expected)
    if model_overrides(strategy, launcher, "fp32", extra):  # the MoE: its router's loss too
        assert_router_loss_logged(first_dir)
        assert_router_loss_logged(second_dir)
    if CHECKPOINTED[0] in extra:
        # Recomputing activations in backward gives the same gradients, so the same losses
        # as the reference, which ran without it (its probe says so).
        probe = json.loads((first_dir / "probes" / "wrapper-rank0.json").read_text())
        assert probe["activation_checkpointing"] is True
        assert reference.probe("wrapper", 0)["activation_checkpointing"] is False
    if tracked:
        check_one_tracker_run(first_dir, second_dir, stop_step, joined, store)
        logs = [(root / f"{name}-1.log").read_text(), again.stdout, again.stderr]
        assert not any(secret in log for secret in SECRETS.values() for log in logs)
        no_wandb_staging_left(root / TMP)


def check_one_tracker_run(first_dir: Path, second_dir: Path, stop_step: int,
                          losses: dict[int, float], store: str) -> None:
    """Both launches and the evaluation after the second (eval.tasks) logged to the same
    wandb and MLflow run; MLflow (read back with its own client) has the run's params,
    each step's loss once and the harness's score at the last step; no secret in any
    file."""
    from mlflow import MlflowClient

    first, second = (json.loads((d / "trackers.json").read_text())
                     for d in (first_dir, second_dir))
    assert (first["wandb"], first["mlflow"]) == (second["wandb"], second["mlflow"])
    assert (first["launches"], second["launches"]) == (1, 2)
    # wandb offline: one folder per launch, offline-run-<time>-<run id>, in its run dir
    offline = [p for d in (first_dir, second_dir) for p in (d / "wandb").glob("offline-run-*")]
    assert len(offline) == 3 and {p.name.rsplit("-", 1)[1] for p in offline} == {first["wandb"]}
    assert all(any(p.glob("*.wandb")) for p in offline), offline

    client = MlflowClient(store)
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(experiments)
    assert run.info.run_id == first["mlflow"] and run.info.status == "FINISHED"
    params, plan = run.data.params, json.loads((first_dir / "plan.json").read_text())
    assert params["ftl.strategy"] == "ddp" and params["ftl.world_size"] == "2"
    assert params["ftl.estimate.peak_bytes"] == str(plan["estimate"]["peak_bytes"])
    assert params["train.max_steps"] == str(MAX_STEPS)  # the resolved config
    assert params["ftl.launch.1.start_step"] == str(stop_step)
    assert {"ftl.launch.0.startup.first_step", "ftl.launch.1.startup.first_step"} <= set(params)
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, MAX_STEPS + 1))  # each once
    assert {m.step: m.value for m in history} == pytest.approx(losses)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval_loss")] == \
        [0, MAX_STEPS]  # eval_on_start, and the final eval after train() in the same run
    (score,) = client.get_metric_history(run.info.run_id, "eval_harness/arith/exact_match")
    assert score.step == MAX_STEPS and 0 <= score.value <= 1  # ftl eval's, after training

    files = [p for root in (first_dir, second_dir, Path(store.removeprefix("file://")))
             for p in root.rglob("*") if p.is_file()]
    for secret in SECRETS.values():
        assert not [p for p in files if secret.encode() in p.read_bytes()], secret


def test_a_second_ctrl_c_aborts_at_once(runs_root: Path) -> None:
    root, name = runs_root / "signals", "abort"
    root.mkdir(parents=True, exist_ok=True)
    slower = SLOW.replace("seconds:0.5", "seconds:5")  # no step boundary within the test
    log = root / f"{name}.log"
    proc = start_in_session(ftl_train_argv(root, name, ["strategy=ddp", slower]), log)
    try:
        # The start-up record: rank 0 writes it at step 1's end, before that end's 5 s
        # sleep (the worker's callbacks come before injected ones), where the signals land.
        wait_for_record(lambda: (run_dirs(root, name) or [None])[-1] and
                        run_dirs(root, name)[-1] / "metrics.jsonl", proc,
                        "the start-up record", lambda record: record.get("event") == "startup")
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
    # The ranks agreed to stop at step 1 (their first vote, if the request was there) or
    # step 2 (the next, a step later) and were killed in step 1's 5 s end, before either
    # save: a graceful stop instead of the abort would have completed that checkpoint.
    run_dir = run_dirs(root, name)[-1]
    assert not [c for c in list_checkpoints(run_dir / "checkpoints") if is_complete(c)]
    assert "aborting" in log.read_text()
