"""`ftl submit`, `ftl status` and `ftl cancel`, for any scheduler (launcher/schedulers/base.py).
submit validates every job first, so a sweep (`-m train.lr=1e-5,2e-5`, expanded by Hydra's
own parser and BasicSweeper) submits nothing unless every combination is valid; --dry-run
prints the job script even where this machine could not hold the run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

import launcher.schedulers.base
from launcher.config.compose import override_key
from launcher.data.preprocess import read_prepared
from launcher.errors import ConfigError
from launcher.run.hang_report import hang_lines
from launcher.run.launch import BuiltRun, build_run, check, write_run
from launcher.rundir import STOPPED_EXIT, RunDir, job_script_name, write_file_atomic, write_run_dir
from launcher.rundir.checkpoints import latest_complete_checkpoint
from launcher.schedulers.base import SCHEDULERS, JobInfo, Scheduler, get_scheduler
from launcher.validation.validate import Checked


def submit(overrides: list[str], dry_run: bool = False, multirun: bool = False) -> int:
    jobs = expand_sweep(overrides) if multirun else [list(overrides)]
    jobs = [with_default_cluster(job) for job in jobs]
    checked = check_jobs(jobs, dry_run)
    for index, (job, job_checked) in enumerate(zip(jobs, checked, strict=True)):
        if len(jobs) > 1:
            print(f"# job {index + 1} of {len(jobs)}: {' '.join(job)}", flush=True)
        submit_checked(job_checked, job, dry_run)
    return 0


def with_default_cluster(overrides: list[str]) -> list[str]:
    """`ftl submit` / `make submit` without a cluster= choice: the default scheduler's."""
    chosen = any(override_key(o) == "cluster" for o in overrides if "=" in o)
    default = launcher.schedulers.base.DEFAULT_SCHEDULER  # its preset: configs/cluster/<name>.yaml
    return overrides if chosen else [f"cluster={default}", *overrides]


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """Hydra multirun semantics: `a=1,2 b=x,y` -> 4 override lists (cartesian product)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as error:  # noqa: BLE001 - Hydra's parser raises its own types
        raise ConfigError(f"{' '.join(overrides)}: not a valid Hydra sweep ({error}).") from None
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [list(job) for batch in batches for job in batch]


def check_jobs(jobs: list[list[str]], dry_run: bool = False) -> list[Checked]:
    """Every problem of every job in one ConfigError, before anything is written."""
    problems: list[str] = []
    checked: list[Checked] = []
    for job in jobs:
        prefix = f"[{' '.join(job)}] " if len(jobs) > 1 else ""
        try:
            checked.append(check(job, "submit", dry_run=dry_run))
        except ConfigError as error:
            problems += [prefix + problem for problem in error.problems]
    if problems:
        raise ConfigError(problems)
    return checked


def submit_checked(
    checked: Checked, overrides: list[str], dry_run: bool
) -> tuple[Path, str | None]:
    """Write the run dir (with the job script); submit unless dry_run. -> (run dir, job id)."""
    # the job's rank 0 tokenizes when nobody has: say so, and how to do it here instead
    if checked.data_dir is not None and read_prepared(checked.data_dir) is None:
        print(f"ftl submit: the data is not tokenized yet ({checked.data_dir}): rank 0 of the "
              "job will do it while the other ranks wait; `ftl preprocess` with the same "
              "overrides does it here first.", file=sys.stderr)
    scheduler = get_scheduler(checked.cfg.cluster.scheduler)
    name = job_script_name(scheduler.name)
    if dry_run:
        return _dry_run(build_run(checked, overrides), name), None
    run_dir = RunDir(write_run(checked, overrides).run_dir)
    job_id = scheduler.submit(run_dir / name)
    write_file_atomic(run_dir.job_id, job_id + "\n")
    print(
        f"ftl submit: job {job_id}\n"
        f"  run dir: {run_dir.path}\n"
        f"  script:  {run_dir / name}\n"
        f"  logs:    {run_dir.logs} (the job's output and each rank's)\n"
        f"  watch:   ftl status {job_id}    stop: ftl cancel {job_id}",
        flush=True,
    )
    return run_dir.path, job_id


def _dry_run(built: BuiltRun, name: str) -> Path:
    """Print the job script; write the run dir where this machine can (`ftl status` then
    reads it), and say so where it cannot: the script is what the user asked for."""
    print(built.files[name], end="")
    try:
        write_run_dir(built.run_dir, built.files, executable=built.executable)
    except OSError as error:
        print(f"# dry run: not submitted; run dir not written here ({error})")
    else:
        print(f"# dry run: not submitted. run dir: {built.run_dir}\n"
              f"# the job script: {built.run_dir / name}")
    return built.run_dir


# --- status and cancel -------------------------------------------------------------------


def scheduler_of(run_dir: Path | None) -> Scheduler:
    """The scheduler a run dir's config names; the default one for a bare job id."""
    name = launcher.schedulers.base.DEFAULT_SCHEDULER
    if run_dir is not None and RunDir(run_dir).config.is_file():
        name = str(OmegaConf.load(RunDir(run_dir).config).cluster.get("scheduler", name))
    if name not in SCHEDULERS:
        raise ConfigError(f"{run_dir}: cluster.scheduler={name} is not a batch scheduler; "
                          "this run was not submitted. Fix: `ftl report RUN_DIR`.")
    return get_scheduler(name)


def resolve_target(target: str) -> tuple[str | None, Path | None, JobInfo | None]:
    """RUN_DIR or JOBID -> (job id, run dir, what the scheduler says), None where unknown."""
    path = Path(target)
    if path.is_dir():
        id_file = RunDir(path).job_id
        job_id = id_file.read_text().strip() if id_file.is_file() else None
        info = scheduler_of(path).status(job_id) if job_id else None
        return job_id or None, path.resolve(), info
    scheduler = scheduler_of(None)
    if scheduler.is_job_id(target):
        info = scheduler.status(target)
        run_dir = info.script.parent if info and info.script else None
        return target, run_dir, info
    raise ConfigError(
        f"{target}: neither a run directory nor a job id. "
        "Fix: `ftl status outputs/<name>/<time>` or `ftl status <JOBID>`."
    )


def status(target: str) -> int:
    job_id, run_dir, info = resolve_target(target)
    if info is None and run_dir is None:
        raise ConfigError(
            f"job {job_id}: the scheduler does not know it (a wrong id, or it ended a while "
            "ago: schedulers keep ended jobs only briefly). Fix: `ftl status RUN_DIR`, which "
            "also reads the run's own state."
        )
    if info is not None:
        job = (f"job {job_id}: {info.state} (exit {info.exit_code}, restarts {info.restarts},"
               f" run time {info.run_time}, nodes {info.nodes}, reason {info.reason})")
    elif job_id is not None:
        job = f"job {job_id}: no longer known to the scheduler (it keeps ended jobs briefly)"
    else:
        job = "job: none recorded (not submitted, or a dry run)"
    run = (run_dir_lines(RunDir(run_dir)) if run_dir is not None
           else ["run dir: unknown (the job was not submitted by `ftl submit`)"])
    print("\n".join([job, *run]))
    return 0


def run_dir_lines(run_dir: RunDir) -> list[str]:
    """What the run dir says: finished / preempted / progress, checkpoint, logs."""
    lines = [f"run dir: {run_dir.path}"]
    result, stopped = run_dir.read_result(), run_dir.read_preempted()
    if result is not None and run_dir.is_finished():
        lines.append(
            f"run: finished at step {result.global_step} (final train loss "
            f"{result.final_train_loss}, world size {result.world_size}); model: "
            f"{result.model_dir}"
        )
    elif hung := hang_lines(run_dir, _world_size(run_dir)):  # even after a stop request
        lines += [f"run: {hung[0]}", *hung[1:]]
    elif run_dir.cancel_requested.exists() and stopped is not None:
        lines.append(f"run: stopped by `ftl cancel` at step {stopped.step}, not requeued; the "
                     "same `ftl submit` command resumes from the latest complete checkpoint "
                     "(run.resume=auto)")
    elif run_dir.cancel_requested.exists():
        lines.append("run: stopping (`ftl cancel`): the ranks save a checkpoint at the next "
                     f"step boundary; {_progress(run_dir)}")
    elif run_dir.preempted.exists():
        step = stopped.step if stopped else None
        lines.append(f"run: stopped for preemption at step {step}; requeued")
    else:
        lines.append(f"run: {_progress(run_dir)}")
    checkpoint = latest_complete_checkpoint(run_dir.checkpoints)
    lines.append(f"latest complete checkpoint: {checkpoint or 'none yet'}")
    lines.append(f"logs: {run_dir.logs}")
    return lines


def _world_size(run_dir: RunDir) -> int | None:
    """From plan.json, to name the ranks that left no hang record."""
    try:
        return run_dir.read_plan().world_size
    except (OSError, ValueError):
        return None


def _progress(run_dir: RunDir) -> str:
    events = run_dir.read_metrics()
    if not events:
        return "not started yet (or no step logged)"
    try:
        max_steps = int(OmegaConf.load(run_dir.config).train.max_steps)
    except Exception:  # noqa: BLE001 - a missing/odd config only loses the "of N"
        max_steps = 0
    return f"running, step {events[-1].step}" + (f" of {max_steps}" if max_steps > 0 else "")


def cancel(target: str) -> int:
    """A running job: stop for good after a checkpoint. Otherwise (pending,
    or its run dir unknown): the scheduler's own cancel."""
    job_id, run_dir, info = resolve_target(target)
    if job_id is None:
        raise ConfigError(f"{target}: no job recorded for this run dir (a dry run?).")
    scheduler = scheduler_of(run_dir)
    if info is not None and info.running and run_dir is not None:
        # cancel.requested first: a job script that starts meanwhile clears
        # preempt.requested but then sees cancel.requested (launcher/schedulers/base.py)
        write_file_atomic(RunDir(run_dir).cancel_requested, f"{time.time()}\n")
        RunDir(run_dir).preempt_requested.touch()
        print(
            f"ftl cancel: job {job_id} is running: its ranks save a checkpoint at the next "
            "step boundary and stop; the job then ends with exit status "
            f"{STOPPED_EXIT} (stopped, resumable) and is not requeued.\n"
            f"  run dir: {run_dir}\n"
            f"  watch:   ftl status {job_id}\n"
            f"  to end it now, without waiting for the checkpoint: "
            f"{scheduler.cancel_command(job_id)}",
            flush=True,
        )
        return 0
    scheduler.cancel(job_id)
    where = f" (run dir {run_dir})" if run_dir else ""
    state = f" ({info.state})" if info is not None else ""
    print(f"ftl cancel: cancelled job {job_id}{state}{where}", flush=True)
    return 0
