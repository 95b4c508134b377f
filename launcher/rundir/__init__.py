"""The run dir, the contract between the launcher and the ranks: every file name in it, its
atomic creation, and the one reader and writer of each JSON file (their dataclasses:
records.py; who writes what: the table in docs/design.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from launcher.rundir.records import (
    CompleteMarker,
    DoctorReport,
    EvalSummary,
    ExamplesRecord,
    HangRecord,
    LaunchRecord,
    MetricsEvent,
    PairsRecord,
    PlanRecord,
    Preempted,
    RankMetrics,
    Record,
    RunResult,
    StartupRecord,
    TrackerRuns,
)

R = TypeVar("R", bound=Record)

CONFIG = "config.yaml"
PLAN = "plan.json"
LAUNCH_SCRIPT = "launch.sh"
DS_CONFIG = "ds_config.json"
UNIVERSAL_DS_CONFIG = "ds_config.universal.json"
FSDP = "fsdp.json"
HOSTFILE = "hostfile"
RESUME_FROM = "resume_from"
PREEMPT_REQUESTED = "preempt.requested"
PREEMPTED = "preempted"
UNIVERSAL = "universal"
"""RUN_DIR/universal/checkpoint-N: a ZeRO checkpoint converted for this run's world size."""
CANCEL_REQUESTED = "cancel.requested"
CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
RESULT = "result.json"
EXAMPLES = "examples.json"
PAIRS = "pairs.json"
DOCTOR = "doctor.json"
EVAL = "eval"
"""RUN_DIR/eval/<timestamp>/: one evaluation (EvalDir)."""
LOGS = "logs"
PROBES = "probes"
# Exit statuses: a contract between the ranks, the launcher, the job script and the user.
STOPPED_EXIT = 75
"""Stopped after a complete checkpoint: the same command resumes (EX_TEMPFAIL, "try again")."""
HUNG_EXIT = 76
"""A rank's exit status when its hang watchdog ended it, and `ftl train`'s (and a Slurm
job's) when the run ended that way: resumable from the last complete checkpoint, like
STOPPED_EXIT."""
ABORTED_EXIT = 130
"""Aborted by a second Ctrl-C / SIGTERM (128 + SIGINT, as a shell reports an interrupt)."""
HANG = "hang"
STARTUP = "startup"
TRACKERS = "trackers.json"
COMPLETE_MARKER = "COMPLETE"
STREAM_STATE = "stream.json"
"""In a checkpoint of a streaming run: where the first untrained row is read from
(launcher/data/stream.py), written before the checkpoint is marked COMPLETE."""


def json_text(data: dict[str, Any]) -> str:
    """A plan or settings file's text: sorted keys, indent 2, a trailing newline (small
    diffs between runs)."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def job_script_name(scheduler: str) -> str:
    """job.slurm, job.pbs, ...: one batch script per scheduler kind."""
    return f"job.{scheduler}"


def _file(name: str) -> property:
    return property(lambda self: self.path / name)


def _json_file(
    name: str, record: type[R], indent: int | None = None
) -> tuple[Callable[[RunDir], R | None], Callable[[RunDir, R], None]]:
    """The reader and the writer of the run dir's file `name`, which holds one `record`."""
    return (lambda self: _read_optional(self.path / name, record),
            lambda self, value: _write(self.path / name, value, indent))


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run dir, and the one reader and writer of each JSON file in it."""

    path: Path

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    config = _file(CONFIG)
    plan = _file(PLAN)
    ds_config = _file(DS_CONFIG)
    universal_ds_config = _file(UNIVERSAL_DS_CONFIG)
    fsdp = _file(FSDP)
    hostfile = _file(HOSTFILE)
    resume_from = _file(RESUME_FROM)
    checkpoints = _file(CHECKPOINTS)
    model = _file("model")
    launches = _file("launches.jsonl")
    metrics = _file(METRICS)
    rank_metrics = _file("metrics")
    result = _file(RESULT)
    examples = _file(EXAMPLES)
    pairs = _file(PAIRS)
    tensorboard = _file("tensorboard")
    trackers = _file(TRACKERS)
    logs = _file(LOGS)
    probes = _file(PROBES)
    hang = _file(HANG)
    report_png = _file("report.png")
    job_id = _file("job_id")
    preempt_requested = _file(PREEMPT_REQUESTED)
    preempted = _file(PREEMPTED)
    cancel_requested = _file(CANCEL_REQUESTED)
    startup = _file(STARTUP)
    doctor = _file(DOCTOR)  # rank 0 of `ftl doctor`: the checks' rows
    doctor_dir = _file("doctor")  # its token files
    eval_root = _file(EVAL)

    read_doctor, write_doctor = _json_file(DOCTOR, DoctorReport, indent=2)
    read_result, write_result = _json_file(RESULT, RunResult, indent=2)
    write_examples = _json_file(EXAMPLES, ExamplesRecord, indent=2)[1]
    read_pairs, write_pairs = _json_file(PAIRS, PairsRecord, indent=2)
    read_preempted, write_preempted = _json_file(PREEMPTED, Preempted)
    read_trackers, write_trackers = _json_file(TRACKERS, TrackerRuns)

    def startup_file(self, rank: int) -> Path:
        return self.startup / f"rank-{rank}.json"

    def write_startup(self, record: StartupRecord) -> None:
        _write(self.startup_file(record.rank), record)

    def started_nodes(self) -> set[int]:
        """The nodes whose batch-job task started its launcher (startup/node-<N>.json)."""
        names = (p.stem.removeprefix("node-") for p in self.startup.glob("node-*.json"))
        return {int(name) for name in names if name.isdigit()}

    def read_startups(self) -> dict[int, StartupRecord]:
        """rank -> its start-up record, for the ranks that wrote one (this launch's: the
        records of an earlier start of a requeued job are replaced as its ranks start)."""
        found = (_read_optional(p, StartupRecord) for p in self.startup.glob("rank-*.json"))
        return {record.rank: record for record in found if record is not None}

    def rank_error(self, rank: int | str) -> Path:
        return self.logs / f"rank{rank}.error"

    def rank_errors(self) -> dict[str, Path]:
        """rank -> its logs/rank<R>.error (the ranks that failed), by file name."""
        return {p.stem.removeprefix("rank"): p for p in sorted(self.logs.glob("rank*.error"))}

    def hang_stacks(self, rank: int | str) -> Path:
        return self.hang / f"rank-{rank}.txt"

    def hang_record_file(self, rank: int | str) -> Path:
        return self.hang / f"rank-{rank}.json"

    def flight_recorder_file(self, rank: int | str) -> Path:
        return self.hang / f"rank-{rank}.fr.json"

    def write_hang(self, record: HangRecord) -> None:
        _write(self.hang_record_file(record.rank), record)

    def read_hangs(self) -> list[HangRecord]:
        """Every rank's hang record, by rank; unreadable ones are skipped."""
        files = [p for p in self.hang.glob("rank-*.json")
                 if p.stem.removeprefix("rank-").isdigit()]  # not rank-<R>.fr.json
        found = (_read_optional(p, HangRecord) for p in files)
        return sorted((r for r in found if r is not None), key=lambda r: r.rank)

    def is_finished(self) -> bool:
        return self.result.is_file() and not self.preempted.exists()

    def read_plan(self) -> PlanRecord:
        return PlanRecord.from_dict(json.loads(self.plan.read_text()))

    def record_launch(self, world_size: int, resumed_from: str | None,
                      start_step: int) -> LaunchRecord:
        """This launch's launches.jsonl line; its number (counted from 0) is decided here
        only, and every later reader takes it from the last line (`current_launch`)."""
        record = LaunchRecord(len(self.read_launches()), time.time(), world_size,
                              resumed_from, start_step)
        _append(self.launches, record.to_dict())
        return record

    def read_launches(self) -> list[LaunchRecord]:
        return [LaunchRecord.from_dict(d) for d in _read_lines(self.launches)]

    def current_launch(self) -> int:
        launches = self.read_launches()
        return launches[-1].launch if launches else 0

    def append_metrics(self, event: MetricsEvent) -> None:
        _append(self.metrics, event.to_dict())

    def read_metrics(self) -> list[MetricsEvent]:
        """Every event so far; a line still being written (or torn) is skipped."""
        return [MetricsEvent.from_dict(d) for d in _read_lines(self.metrics) if "step" in d]

    def rank_metrics_file(self, rank: int) -> Path:
        return self.rank_metrics / f"rank{rank}.json"

    def write_rank_metrics(self, record: RankMetrics) -> None:
        _write(self.rank_metrics_file(record.rank), record)

    def read_rank_metrics(self, rank: int) -> RankMetrics | None:
        return _read_optional(self.rank_metrics_file(rank), RankMetrics)

    def all_rank_metrics(self) -> list[RankMetrics]:
        files = sorted(self.rank_metrics.glob("rank*.json"))
        return [RankMetrics.from_dict(json.loads(p.read_text())) for p in files]


def write_complete_marker(checkpoint: Path, step: int, world_size: int, tp: int = 1,
                          sp: int = 1) -> None:
    """Rank 0 only, after every rank has finished writing `checkpoint`."""
    _write(checkpoint / COMPLETE_MARKER, CompleteMarker(step, world_size, time.time(), tp, sp))


def write_stream_state(checkpoint: Path, state: dict[str, Any]) -> None:
    write_file_atomic(checkpoint / STREAM_STATE, json.dumps(state) + "\n")


def read_stream_state(checkpoint: Path) -> dict[str, Any] | None:
    """None when the checkpoint has none (not a streaming run's)."""
    path = checkpoint / STREAM_STATE
    return json.loads(path.read_text()) if path.is_file() else None


def read_complete_marker(checkpoint: Path) -> CompleteMarker | None:
    return _read_optional(checkpoint / COMPLETE_MARKER, CompleteMarker)


def _write(path: Path, record: Record, indent: int | None = None) -> None:
    """Every record file is written whole or not at all: its readers (other ranks, `ftl
    train`, `ftl status`) may read it at any moment."""
    path.parent.mkdir(exist_ok=True)
    write_file_atomic(path, json.dumps(record.to_dict(), indent=indent) + "\n")


def _read_optional(path: Path, record: type[R]) -> R | None:
    """None when the file is missing or unreadable (a reader never fails on it)."""
    try:
        return record.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _append(path: Path, data: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(data) + "\n")


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; others (a torn last line) are skipped."""
    values = []
    if path.is_file():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                values.append(json.loads(line))
    return [value for value in values if isinstance(value, dict)]


@dataclass(frozen=True)
class EvalDir:
    """RUN_DIR/eval/<timestamp>[-label]/: one evaluation's files."""

    path: Path

    results = _file("results.json")  # the harness's results, as it reports them
    read_summary, write_summary = _json_file("summary.json", EvalSummary, indent=2)

    def samples(self, task: str) -> Path:
        """The harness's per-sample log of one task (prompt, answer, target, metrics)."""
        return self.path / f"samples_{task}.jsonl"


def new_eval_dir(run_dir: RunDir, label: str = "") -> EvalDir:
    """RUN_DIR/eval/<timestamp>[-label], created (a -N suffix if taken)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S") + (f"-{label}" if label else "")
    candidate, counter = run_dir.eval_root / stamp, 1
    while candidate.exists():
        candidate, counter = run_dir.eval_root / f"{stamp}-{counter}", counter + 1
    candidate.mkdir(parents=True)
    return EvalDir(candidate)


def new_run_dir_path(output_dir: str, run_name: str) -> Path:
    """outputs/<name>/<timestamp>, with a -N suffix if that second is taken."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
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


def write_file_atomic(path: Path, text: str) -> None:
    """One file, whole or not at all (a reader never sees half of it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    os.replace(tmp, path)
