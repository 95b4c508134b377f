"""Real Slurm jobs on this machine (scripts/slurm-local.sh: two slurmd "nodes" on one host).

Each job trains the tiny Llama for a few steps through the real path: `ftl submit`'s code
writes the run dir and job.sbatch, `sbatch --parsable` submits it, srun starts torchrun or
deepspeed on each node, the ranks run launcher.worker. Nothing is mocked.

Skipped only when this machine has no Slurm client (`sinfo`), and under CI a skip fails
the run (tests/conftest.py); CI brings the cluster up
with `scripts/slurm-local.sh up` first (and this module does too, as root, if it is down).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from launcher.slurm import scancel, show_job
from launcher.submit import cancel, status, submit_one, with_slurm_default

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "x'; touch /tmp/owned #"
OWNED = Path("/tmp/owned")
STEPS = 6
# Few optimizer steps of the tiny model; no periodic checkpoint, so the only checkpoint
# before the end of a preempted run is the one the preemption forced.
TINY = [
    "cluster.gpu=cpu",
    f"train.max_steps={STEPS}",
    "train.micro_batch_size=4",
    "train.grad_accum=1",
    "train.lr=3e-3",
    "train.warmup_ratio=0.0",
    "train.lr_scheduler=constant",
    "train.logging_steps=1",
    "train.save_steps=1000",
    "cluster.slurm.time=15",
    "cluster.slurm.signal_grace_s=60",
]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE"}
JOB_TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Job:
    job_id: str
    run_dir: Path
    info: dict[str, str] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        return self.run_dir / "logs" / f"slurm-{self.job_id}.out"

    @property
    def result(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "result.json").read_text())

    def losses(self) -> dict[int, float]:
        """step -> train loss from metrics.jsonl (a resumed run appends; later lines win)."""
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        return {r["step"]: r["loss"] for r in records if "loss" in r}

    def logs(self) -> str:
        """Everything useful when a job failed: batch output/error and rank errors."""
        parts = []
        for path in sorted((self.run_dir / "logs").rglob("*")):
            if path.is_file() and (path.name.startswith("slurm-") or path.suffix == ".error"
                                   or path.name.endswith(".log")):
                parts.append(f"--- {path}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


@pytest.fixture(scope="module")
def slurm() -> None:
    if shutil.which("sinfo") is None:
        pytest.skip("no Slurm client (sinfo) here; as root: scripts/slurm-local.sh up")
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        if os.geteuid() != 0:
            pytest.fail("Slurm is installed but not running: scripts/slurm-local.sh up (root)")
        subprocess.run([str(ROOT / "scripts" / "slurm-local.sh"), "up"], check=True)


def submit_job(overrides: list[str]) -> Job:
    """`ftl submit`'s own path, from the project root (where the job's ranks start)."""
    job = with_slurm_default([*overrides, f"cluster.master_port={free_port()}"])
    with redirect_stdout(StringIO()), contextlib.chdir(ROOT):
        run_dir, job_id = submit_one(job, dry_run=False)
    assert job_id is not None
    return Job(job_id, run_dir)


def wait_for(job: Job, timeout_s: float = JOB_TIMEOUT_S) -> dict[str, str]:
    """Poll `scontrol show job` until the job has ended (a requeue is not an end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = show_job(job.job_id)
        assert info is not None, f"Slurm forgot job {job.job_id}"
        if info["JobState"] in TERMINAL:
            return info
        time.sleep(1)
    scancel(job.job_id)
    raise AssertionError(f"job {job.job_id} still running after {timeout_s} s\n{job.logs()}")


def wait_for_text(path: Path, text: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}")


def assert_completed(job: Job, info: dict[str, str]) -> None:
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (
        f"job {job.job_id}: {info['JobState']} {info['ExitCode']}\n{job.logs()}"
    )


@pytest.fixture(scope="module")
def reference(slurm: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    """One uninterrupted single-node job (2 processes), with a hostile run name."""
    OWNED.unlink(missing_ok=True)
    out = tmp_path_factory.mktemp("slurm-reference")
    job = submit_job([*TINY, "cluster.gpus_per_node=2", f"run.output_dir={out}",
                      f'run.name="{HOSTILE}"'])
    job.info = wait_for(job)
    yield job


def test_single_node_job_trains_and_completes(reference: Job) -> None:
    assert_completed(reference, reference.info)
    result = reference.result
    assert result["world_size"] == 2 and result["global_step"] == STEPS
    assert result["final_train_loss"] < result["first_train_loss"]
    printed = StringIO()
    with redirect_stdout(printed):
        assert status(reference.job_id) == 0
    text = printed.getvalue()
    assert f"job {reference.job_id}: COMPLETED" in text
    assert f"run: finished at step {STEPS}" in text
    printed = StringIO()
    with redirect_stdout(printed):
        assert status(str(reference.run_dir)) == 0
    assert f"job {reference.job_id}: COMPLETED" in printed.getvalue()


def test_hostile_run_name_never_executes(reference: Job) -> None:
    assert HOSTILE in str(reference.run_dir)  # the name really went through sbatch and bash
    assert_completed(reference, reference.info)
    assert not OWNED.exists(), "a quoted run name was executed by the job script"


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_two_node_job_trains_with_world_size_two(
    slurm: None, tmp_path: Path, launcher: str
) -> None:
    strategy = "zero2" if launcher == "deepspeed" else "ddp"
    job = submit_job([*TINY, "train.max_steps=4", "cluster.nodes=2", "cluster.gpus_per_node=1",
                      f"cluster.launcher={launcher}", f"strategy={strategy}",
                      "train.callbacks=[{_target_:tests.integration.probes.WrapperProbe}]",
                      f"run.output_dir={tmp_path}"])
    info = wait_for(job)
    assert_completed(job, info)
    assert info["NodeList"] == "node[1-2]" and info["NumNodes"] == "2"
    result = job.result
    assert result["world_size"] == 2 and result["global_step"] == 4
    wrappers = [json.loads((job.run_dir / "probes" / f"wrapper-rank{r}.json").read_text())
                for r in range(2)]
    assert [w["world_size"] for w in wrappers] == [2, 2]
    if launcher == "deepspeed":
        assert [w["zero_stage"] for w in wrappers] == [2, 2]
        # one deepspeed launcher per node, each started its node's rank
        assert (job.run_dir / "hostfile").read_text() == "node1 slots=1\nnode2 slots=1\n"
    else:
        assert (job.run_dir / "logs" / "node-0").is_dir()
        assert (job.run_dir / "logs" / "node-1").is_dir()


def test_preemption_checkpoints_requeues_and_resumes(reference: Job, tmp_path: Path) -> None:
    job = submit_job([*TINY, "cluster.gpus_per_node=2", f"run.output_dir={tmp_path}",
                      "run.name=preempted"])
    # The trap is installed before this line is printed; the ranks start after it.
    wait_for_text(job.out, f"ftl: job {job.job_id} (restart 0)")
    scancel(job.job_id, signal="USR1", batch_only=True)
    info = wait_for(job)
    assert_completed(job, info)
    log = job.out.read_text()
    assert info["Restarts"] == "1", log
    assert "ftl: requeueing (restart 1 of 3)" in log
    assert f"ftl: job {job.job_id} (restart 1)" in log
    result = job.result
    assert result["global_step"] == STEPS
    resumed = Path(result["resumed_from"])
    step = int(resumed.name.removeprefix("checkpoint-"))
    assert 1 <= step < STEPS and (resumed / "COMPLETE").is_file()
    # Every step's loss, before and after the resume, equals the uninterrupted run's.
    expected = reference.losses()
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert job.losses() == pytest.approx(expected, rel=1e-6, abs=1e-9)


SLOW_STEPS = "train.callbacks=[{_target_:tests.integration.probes.SlowSteps,seconds:0.5}]"


def wait_for_step(job: Job, step: int, timeout_s: float = 300) -> None:
    """Until the job's rank 0 has logged `step` (half-second steps: SlowSteps)."""
    wait_for_text(job.out, f"[ftl] step {step}/{STEPS}", timeout_s)


def assert_resumed_like_the_reference(job: Job, reference: Job) -> int:
    """The requeued run finished, resumed from a complete checkpoint of the stop, and every
    step's loss (exactly one per step) equals the uninterrupted run's. -> the stop step."""
    result = job.result
    assert result["global_step"] == STEPS
    resumed = Path(result["resumed_from"])
    step = int(resumed.name.removeprefix("checkpoint-"))
    assert 1 <= step < STEPS and (resumed / "COMPLETE").is_file()
    assert not (job.run_dir / "preempted").exists()  # the rerun's start cleared it
    lines = (job.run_dir / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line)["step"] for line in lines if '"loss"' in line]
    assert sorted(logged) == list(range(1, STEPS + 1)), logged  # one loss per step
    assert job.losses() == pytest.approx(reference.losses(), rel=1e-6, abs=1e-9)
    return step


def test_step_sigterm_checkpoints_requeues_and_resumes(reference: Job, tmp_path: Path) -> None:
    """`scancel --signal=TERM` reaches the job step only (not the batch shell): the per-node
    task turns it into a stop request, its launcher is spared, the job requeues itself."""
    job = submit_job([*TINY, "cluster.gpus_per_node=2", f"run.output_dir={tmp_path}",
                      "run.name=sigterm", SLOW_STEPS])
    wait_for_step(job, 2)
    scancel(job.job_id, signal="TERM")
    info = wait_for(job)
    assert_completed(job, info)
    log = job.out.read_text()
    assert info["Restarts"] == "1", log
    assert "ftl: node 0: TERM: checkpointing at the next step" in log
    # torchrun was not signalled: it and its ranks exited 0 after the checkpoint
    assert "ftl: requeueing (restart 1 of 3)" in log and "(step exit code 0)" in log, log
    assert_resumed_like_the_reference(job, reference)


def test_time_limit_warning_checkpoints_requeues_and_resumes(
        reference: Job, tmp_path: Path) -> None:
    """Slurm's own timer, nothing sent by hand: --time=5 with the USR1 warning 240 s before
    the limit, due 60 s after the start (slurmctld sends it up to a minute late). The first
    launch's steps take 25 s, so the warning lands mid-run; the requeued launch (a fresh
    limit) runs at full speed and ends before its own warning."""
    slow_first_launch = ("train.callbacks=[{_target_:tests.integration.probes.SlowSteps,"
                         "seconds:25,restart:0}]")
    job = submit_job([*TINY, "cluster.gpus_per_node=2", f"run.output_dir={tmp_path}",
                      "run.name=time-limit", "cluster.slurm.time=5",
                      "cluster.slurm.signal_grace_s=240", slow_first_launch])
    info = wait_for(job)
    assert_completed(job, info)
    log = job.out.read_text()
    assert info["Restarts"] == "1", log
    assert "ftl: USR1 at " in log and "ftl: requeueing (restart 1 of 3)" in log, log
    assert_resumed_like_the_reference(job, reference)


def test_ftl_cancel_saves_and_stops_for_good(slurm: None, tmp_path: Path) -> None:
    job = submit_job([*TINY, "cluster.gpus_per_node=2", f"run.output_dir={tmp_path}",
                      "run.name=cancelled", SLOW_STEPS])
    wait_for_step(job, 2)
    printed = StringIO()
    with redirect_stdout(printed):
        assert cancel(job.job_id) == 0
    assert f"job {job.job_id} is running" in printed.getvalue()
    assert f"scancel {job.job_id}" in printed.getvalue()
    info = wait_for(job)
    log = job.out.read_text()
    assert info["ExitCode"] == "75:0" and info["Restarts"] == "0", (info, job.logs())
    stopped = json.loads((job.run_dir / "preempted").read_text())
    step = stopped["step"]
    assert 2 <= step < STEPS, stopped
    checkpoint = job.run_dir / "checkpoints" / f"checkpoint-{step}"
    assert (checkpoint / "COMPLETE").is_file()
    assert not (job.run_dir / "result.json").exists()
    assert f"cancelled by `ftl cancel` after a complete checkpoint (step {step})" in log
    assert "ftl: requeueing" not in log and "(restart 1)" not in log
    printed = StringIO()
    with redirect_stdout(printed):
        assert status(str(job.run_dir)) == 0
    assert f"run: stopped by `ftl cancel` at step {step}, not requeued" in printed.getvalue()


def test_status_and_cancel_of_a_pending_job(slurm: None, tmp_path: Path) -> None:
    # Held (sbatch --hold): pending, so `ftl cancel` is Slurm's own cancel, at once.
    job = submit_job([*TINY, "cluster.gpus_per_node=1", f"run.output_dir={tmp_path}",
                      "cluster.slurm.sbatch_extra=[--hold]"])
    printed = StringIO()
    with redirect_stdout(printed):
        assert cancel(str(job.run_dir)) == 0
    assert f"cancelled job {job.job_id} (PENDING)" in printed.getvalue()
    info = wait_for(job, timeout_s=120)
    assert info["JobState"] == "CANCELLED"
    assert not (job.run_dir / "cancel.requested").exists()
    printed = StringIO()
    with redirect_stdout(printed):
        assert status(job.job_id) == 0
    assert f"job {job.job_id}: CANCELLED" in printed.getvalue()
    assert str(job.run_dir) in printed.getvalue()
