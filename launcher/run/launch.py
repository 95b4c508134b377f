"""The launch edge: compose -> validate -> plan -> the run dir on disk -> the local launcher
subprocess. Every decision comes from the one validation stage and the pure planner."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher import timing
from launcher.config.compose import compose_config
from launcher.config.objectives import is_dpo
from launcher.config.schema import RunConfig
from launcher.launchers.command import Launch, build_launch
from launcher.launchers.supervisor import Supervisor
from launcher.run.hang_report import hang_lines
from launcher.run.planner import Plan, make_plan, resolve_tool, run_dir_files
from launcher.run.supervise import supervise
from launcher.rundir import (
    ABORTED_EXIT,
    HUNG_EXIT,
    LAUNCH_SCRIPT,
    STOPPED_EXIT,
    RunDir,
    job_script_name,
    new_run_dir_path,
    write_run_dir,
)
from launcher.rundir.checkpoints import latest_complete_checkpoint
from launcher.schedulers.base import get_scheduler
from launcher.validation.validate import Checked, Target, validate


@dataclass(frozen=True)
class BuiltRun:
    """A run as build_run made it: its plan, and the run dir's path and files (written by
    write_run, or shown by `ftl submit --dry-run`)."""

    plan: Plan
    run_dir: Path
    launch: Launch
    files: dict[str, str]
    """Run-dir file name -> text."""
    executable: tuple[str, ...]


def check(overrides: list[str], target: Target, *, dry_run: bool = False,
          counts_tokens: bool = False) -> Checked:
    """Compose and validate (every problem in one ConfigError); writes nothing."""
    checked = validate(compose_config(overrides), target, dry_run=dry_run,
                       counts_tokens=counts_tokens)
    for warning in checked.warnings:
        print(f"ftl: warning: {warning}", file=sys.stderr, flush=True)
    timing.mark("validated")
    return checked


def create_run(overrides: list[str], target: Target) -> BuiltRun:
    """Compose, validate, plan and (only if all is well) write the run dir."""
    return write_run(check(overrides, target), overrides)


def write_run(checked: Checked, overrides: list[str]) -> BuiltRun:
    """The plan's run dir, written in one atomic step (with the job script for submit)."""
    built = build_run(checked, overrides)
    write_run_dir(built.run_dir, built.files, executable=built.executable)
    return built


def build_run(checked: Checked, overrides: list[str]) -> BuiltRun:
    """The run dir's path and files, the job script's included; writes nothing."""
    timing.mark("data_ready")  # `ftl train` prepares the tokenized data after check()
    plan = make_plan(checked)
    cfg = plan.cfg
    run_dir = new_run_dir_path(cfg.run.output_dir, cfg.run.name).resolve()
    launch = build_launch(cfg, str(run_dir), checked.visible_devices)
    files = run_dir_files(plan, launch, overrides)
    executable = [LAUNCH_SCRIPT]
    if checked.target == "submit":
        scheduler = get_scheduler(cfg.cluster.scheduler)
        tool = Path(resolve_tool(launch.argv)[0])  # the venv's, else a bare name on PATH
        script = job_script_name(scheduler.name)
        files[script] = scheduler.render(
            cfg, run_dir, launch, tool.parent if tool.is_absolute() else None
        )
        executable.append(script)
    if checked.strategy_choice and checked.target != "plan":  # `ftl plan` prints the why
        print(f"ftl: {checked.strategy_choice}", file=sys.stderr)
    if plan.resume_from is not None:
        print(f"ftl: run.resume={cfg.run.resume} continues from {plan.resume_from}",
              file=sys.stderr)
    return BuiltRun(plan, run_dir, launch, files, tuple(executable))


def run_local(built: BuiltRun) -> int:
    """Start the launcher and watch it (launcher/run/supervise.py: Ctrl-C and SIGTERM stop at a
    step boundary after a checkpoint); on failure say which rank failed and where its log is.
    Exit status: 0 finished, STOPPED_EXIT stopped and resumable, HUNG_EXIT ended by the
    ranks' hang watchdog (where each rank was is printed; resumable), ABORTED_EXIT aborted."""
    run_dir = RunDir(built.run_dir)
    print(f"ftl train: run dir {run_dir.path} (per-rank logs in {run_dir.logs})", flush=True)
    started = timing.process_start_time()
    if started is not None:
        timing.MARKS.mark(timing.FIRST_MARK, started)
    timing.mark("spawn")
    # The ranks report start-up from this process's start (launcher/timing.py).
    env = {**Supervisor.launch_env(os.environ, built.launch.forwards_stop), **built.launch.env,
           **timing.launch_env(str(run_dir.path), timing.MARKS.marks)}
    returncode, aborted = supervise(resolve_tool(built.launch.argv), env, run_dir)
    if aborted:
        print(f"ftl train: aborted. The last complete checkpoint in {run_dir.checkpoints} "
              "(if any) is where the same command resumes.", file=sys.stderr, flush=True)
        return ABORTED_EXIT
    if returncode == 0 and run_dir.result.is_file():
        print(f"ftl train: done. Model: {run_dir.model}", flush=True)
        if built.plan.cfg.train.show_examples > 0:
            after_training(built.plan.cfg, run_dir)
        if built.plan.cfg.eval.tasks:
            from launcher.evaluation.verb import evaluate_run  # torch: only now

            evaluate_run(built.plan.cfg, run_dir)
        return 0
    if returncode == 0:
        print(
            "ftl train: stopped before the last step, after a complete checkpoint in "
            f"{run_dir.checkpoints}; the same `ftl train` command again resumes from it "
            f"(run.resume=auto). Exit status {STOPPED_EXIT}: stopped, resumable.",
            flush=True,
        )
        return STOPPED_EXIT
    hung = hang_lines(run_dir, built.plan.cfg.world_size)
    if hung:
        print("\n".join(["ftl train: " + hung[0], *hung[1:], hang_resume_line(run_dir)]),
              file=sys.stderr, flush=True)
        return HUNG_EXIT
    print(failure_report(run_dir, returncode), file=sys.stderr)
    return 1


def hang_resume_line(run_dir: RunDir) -> str:
    kept = latest_complete_checkpoint(run_dir.checkpoints)
    where = f"from {kept}" if kept else "from the start (no complete checkpoint yet)"
    return (f"ftl train: the same command resumes {where} (run.resume=auto). Exit status "
            f"{HUNG_EXIT}: hung, stopped by the watchdog (train.hang_timeout_s).")


def failure_report(run_dir: RunDir, returncode: int) -> str:
    errors = run_dir.rank_errors()
    full = disk_full_line(run_dir)
    if not errors:
        return "\n".join(filter(None, [
            f"ftl train: the launcher exited with code {returncode} and no rank reported an "
            f"error (killed or crashed at start?). Logs: {run_dir.logs}", full]))
    lines = [f"ftl train: the run failed (launcher exit code {returncode})."]
    for rank, error_file in errors.items():
        text = error_file.read_text().strip().splitlines()
        lines.append(f"  rank {rank}: {text[-1] if text else '?'}  (traceback: {error_file})")
    lines.append(f"  per-rank logs: {run_dir.logs}")
    return "\n".join(filter(None, [*lines, full]))


FULL_DISK_BYTES = 2**20
"""Less free space than this after a failed run: the disk filled up (a save cannot finish,
and a rank may not even have been able to write its error file)."""


def disk_full_line(run_dir: RunDir) -> str | None:
    """The clear error for a disk that filled during the run, naming the checkpoint that
    stays the one to resume from (a half-written one has no COMPLETE marker)."""
    try:
        free = shutil.disk_usage(run_dir.path).free
    except OSError:
        return None
    if free >= FULL_DISK_BYTES:
        return None
    kept = latest_complete_checkpoint(run_dir.checkpoints)
    resume = (f"{kept} is complete and kept: the same command resumes from it"
              if kept else "no complete checkpoint of this launch")
    return (f"ftl train: the filesystem of {run_dir.path} is full ({free} bytes free): a "
            f"save could not finish. {resume}. Fix: free space there (or set "
            "train.save_total_limit / run.output_dir on a larger disk), then run again.")


def after_training(cfg: RunConfig, run_dir: RunDir) -> None:
    """train.show_examples: a DPO run's pairs ranked, else greedy answers (torch: only now)."""
    if is_dpo(cfg):
        from launcher.inference.pairs import show_pairs

        show_pairs(cfg, run_dir)
        return
    from launcher.inference.examples import show_examples

    show_examples(cfg, run_dir)
