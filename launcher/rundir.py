"""The run dir: every file name in it, who writes it, and its atomic creation.

The run dir is the contract between the launcher and the ranks. The launcher writes the
first group in one atomic step (a hidden temp dir renamed into place), so a run dir either
exists complete or not at all; after that, each file below has exactly one writer.

| file                   | writer                      | what                                     |
|------------------------|-----------------------------|------------------------------------------|
| config.yaml            | launcher (atomic)           | the resolved RunConfig the ranks read    |
| plan.json              | launcher (atomic)           | strategy, estimate, FLOPs, command       |
| launch.sh              | launcher (atomic)           | the exact command, runnable by hand      |
| ds_config.json         | launcher (atomic)           | DeepSpeed strategies                     |
| fsdp.json              | launcher (atomic)           | FSDP strategies                          |
| hostfile               | launcher (atomic) or job    | deepspeed multi-node                     |
| resume_from            | launcher (atomic)           | an earlier launch's checkpoint to resume |
| job.<scheduler>        | launcher (atomic)           | the batch script (`ftl submit`)          |
| job_id                 | launcher, after submission  | the scheduler's id of the job            |
| preempt.requested      | job script's traps, rank 0, | ranks save and stop at the next step     |
|                        | `ftl train`, `ftl cancel`   |                                          |
| cancel.requested       | `ftl cancel` (running job)  | the job script ends without requeueing   |
| preempted              | rank 0                      | the ranks stopped for a preemption       |
| checkpoints/           | ranks (Trainer)             | checkpoint-N/, COMPLETE marker by rank 0 |
| model/                 | ranks (rank 0 writes)       | the final HF model                       |
| launches.jsonl         | rank 0, one line per launch | resumed from which checkpoint, at step   |
| metrics.jsonl          | rank 0                      | every log event, start-up, each save     |
| universal/             | rank 0                      | a ZeRO checkpoint converted for resume   |
| metrics/rank<R>.json   | rank R                      | peak memory, tokens seen                 |
| result.json            | rank 0, last                | the finished run's summary               |
| tensorboard/           | rank 0 (Trainer)            | TensorBoard events                       |
| logs/                  | launchers, ranks            | per-rank logs, rank<R>.error             |
| probes/                | injected test callbacks     | evidence for tests only                  |
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

CONFIG = "config.yaml"
PLAN = "plan.json"
LAUNCH_SCRIPT = "launch.sh"
DS_CONFIG = "ds_config.json"
FSDP = "fsdp.json"
HOSTFILE = "hostfile"
RESUME_FROM = "resume_from"
JOB_ID = "job_id"
PREEMPT_REQUESTED = "preempt.requested"
PREEMPTED = "preempted"
UNIVERSAL = "universal"
"""RUN_DIR/universal/checkpoint-N: a ZeRO checkpoint converted for this run's world size."""
CANCEL_REQUESTED = "cancel.requested"
CHECKPOINTS = "checkpoints"
MODEL = "model"
LAUNCHES = "launches.jsonl"
METRICS = "metrics.jsonl"
RANK_METRICS = "metrics"
RESULT = "result.json"
TENSORBOARD = "tensorboard"
LOGS = "logs"
PROBES = "probes"


def job_script_name(scheduler: str) -> str:
    """job.slurm, job.pbs, ...: one batch script per scheduler kind."""
    return f"job.{scheduler}"


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run dir; the only place that spells its file names."""

    path: Path

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def plan(self) -> Path:
        return self.path / PLAN

    @property
    def ds_config(self) -> Path:
        return self.path / DS_CONFIG

    @property
    def fsdp(self) -> Path:
        return self.path / FSDP

    @property
    def hostfile(self) -> Path:
        return self.path / HOSTFILE

    @property
    def resume_from(self) -> Path:
        return self.path / RESUME_FROM

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def model(self) -> Path:
        return self.path / MODEL

    @property
    def launches(self) -> Path:
        return self.path / LAUNCHES

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def rank_metrics(self) -> Path:
        return self.path / RANK_METRICS

    @property
    def result(self) -> Path:
        return self.path / RESULT

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def logs(self) -> Path:
        return self.path / LOGS

    @property
    def job_id(self) -> Path:
        return self.path / JOB_ID

    @property
    def preempt_requested(self) -> Path:
        return self.path / PREEMPT_REQUESTED

    @property
    def preempted(self) -> Path:
        return self.path / PREEMPTED

    @property
    def cancel_requested(self) -> Path:
        return self.path / CANCEL_REQUESTED

    def rank_error(self, rank: int | str) -> Path:
        return self.logs / f"rank{rank}.error"

    def is_finished(self) -> bool:
        return self.result.is_file() and not self.preempted.exists()


def of_checkpoints_dir(output_dir: str | Path) -> RunDir:
    """The run dir of a Trainer whose output_dir is RUN_DIR/checkpoints (for callbacks)."""
    return RunDir(Path(output_dir).parent)


def new_run_dir_path(output_dir: str, run_name: str, now: datetime | None = None) -> Path:
    """outputs/<name>/<timestamp>, with a -N suffix if that second is taken."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / run_name
    candidate, counter = base / stamp, 1
    while candidate.exists():
        candidate, counter = base / f"{stamp}-{counter}", counter + 1
    return candidate


def write_run_dir(final: Path, files: dict[str, str], executable: tuple[str, ...] = ()) -> Path:
    """Write `files` (relative name -> text) under `final` atomically; returns `final`."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".tmp-{final.name}-{os.getpid()}"
    try:
        staging.mkdir()
        for name, text in files.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            if name in executable:
                target.chmod(0o755)
        (staging / LOGS).mkdir(exist_ok=True)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def write_file_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """One file, whole or not at all (a reader never sees half of it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)
