"""The Slurm verbs: `ftl submit [--dry-run] [-m]`, `ftl status RUN_DIR|JOBID`, `ftl cancel`.

submit: compose + validate every job first (a sweep submits nothing unless every
combination is valid), then per job: write the run dir (launch.prepare), write
RUN_DIR/job.sbatch, `sbatch --parsable` it (not with --dry-run), print job id, run dir and
log paths. A bare `ftl submit` means cluster=slurm; cluster=local is refused.
Sweeps: `-m train.lr=1e-5,2e-5` expands like a Hydra multirun (Hydra's own override
parser and BasicSweeper), one job per combination.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError
from launcher.slurm import (
    JOB_ID_FILE,
    PREEMPTED,
    RESULT_FILE,
    SBATCH_FILE,
    log_paths,
    render_sbatch,
    sbatch,
    scancel,
    show_job,
    slurm_problems,
)


def submit(overrides: list[str], dry_run: bool = False, multirun: bool = False) -> int:
    jobs = expand_sweep(overrides) if multirun else [list(overrides)]
    jobs = [with_slurm_default(job) for job in jobs]
    check_jobs(jobs)
    for index, job in enumerate(jobs):
        if len(jobs) > 1:
            print(f"# job {index + 1} of {len(jobs)}: {' '.join(job)}", flush=True)
        submit_one(job, dry_run)
    return 0


def with_slurm_default(overrides: list[str]) -> list[str]:
    """`ftl submit` / `make submit` without a cluster= choice means cluster=slurm."""
    chosen = any(o.split("=", 1)[0].lstrip("+~") == "cluster" for o in overrides if "=" in o)
    return overrides if chosen else ["cluster=slurm", *overrides]


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


def check_jobs(jobs: list[list[str]]) -> None:
    """Every problem of every job in one ConfigError, before anything is written."""
    from launcher.compose import compose_config
    from launcher.planner import make_plan

    problems: list[str] = []
    for job in jobs:
        prefix = f"[{' '.join(job)}] " if len(jobs) > 1 else ""
        try:
            cfg = compose_config(job)
            found = slurm_problems(cfg)
            if not found:
                make_plan(cfg)  # validation, strategy=auto, ds_config check
        except ConfigError as error:
            found = error.problems
        problems += [prefix + problem for problem in found]
    if problems:
        raise ConfigError(problems)


def submit_one(overrides: list[str], dry_run: bool) -> tuple[Path, str | None]:
    """Write the run dir and job.sbatch; submit unless dry_run. -> (run dir, job id)."""
    from launcher.launch import prepare

    plan, run_dir, launch = prepare(overrides, launching_locally=False)
    tool = Path(sys.executable).parent / launch.argv[0]
    text = render_sbatch(plan.cfg, run_dir, launch, tool_dir=tool.parent if tool.exists() else None)
    script = run_dir / SBATCH_FILE
    _write_atomic(script, text, mode=0o755)
    if dry_run:
        print(text, end="")
        print(f"# dry run: not submitted. run dir: {run_dir}\n# submit it: sbatch {script}")
        return run_dir, None
    job_id = sbatch(script)
    _write_atomic(run_dir / JOB_ID_FILE, job_id + "\n")
    out, err = (path.replace("%j", job_id) for path in log_paths(run_dir))
    print(
        f"ftl submit: job {job_id}\n"
        f"  run dir: {run_dir}\n"
        f"  script:  {script}\n"
        f"  logs:    {out}\n"
        f"           {err}\n"
        f"           {run_dir / 'logs'} (per rank)\n"
        f"  watch:   ftl status {job_id}    stop: ftl cancel {job_id}",
        flush=True,
    )
    return run_dir, job_id


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


# --- status and cancel -------------------------------------------------------------------


def resolve_target(target: str) -> tuple[str | None, Path | None]:
    """RUN_DIR or JOBID -> (job id, run dir), each None where unknown."""
    path = Path(target)
    if path.is_dir():
        id_file = path / JOB_ID_FILE
        job_id = id_file.read_text().strip() if id_file.is_file() else None
        return job_id or None, path.resolve()
    if target.replace("_", "").isdigit():
        info = show_job(target)
        return target, run_dir_of_job(info) if info else None
    raise ConfigError(
        f"{target}: neither a run directory nor a Slurm job id. "
        "Fix: `ftl status outputs/<name>/<time>` or `ftl status <JOBID>`."
    )


def run_dir_of_job(info: dict[str, str]) -> Path | None:
    command = Path(info.get("Command", ""))
    return command.parent if command.name == SBATCH_FILE else None


def status(target: str) -> int:
    job_id, run_dir = resolve_target(target)
    info = show_job(job_id) if job_id is not None else None
    if info is None and run_dir is None:
        raise ConfigError(
            f"job {job_id}: Slurm does not know it (a wrong id, or it ended a while ago: "
            "Slurm keeps ended jobs only briefly). Fix: `ftl status RUN_DIR`, which also "
            "reads the run's own state."
        )
    lines: list[str] = []
    if info is not None:
        lines.append(
            f"job {job_id}: {info.get('JobState', '?')}"
            f" (exit {info.get('ExitCode', '?')}, restarts {info.get('Restarts', '0')},"
            f" run time {info.get('RunTime', '?')}, nodes {info.get('NodeList', '?')},"
            f" reason {info.get('Reason', 'None')})"
        )
    elif job_id is not None:
        lines.append(f"job {job_id}: no longer known to Slurm (it keeps ended jobs briefly)")
    else:
        lines.append("job: none recorded (not submitted, or a dry run)")
    if run_dir is None:
        lines.append("run dir: unknown (the job was not submitted by `ftl submit`)")
    else:
        lines += run_dir_lines(run_dir, job_id)
    print("\n".join(lines))
    return 0


def run_dir_lines(run_dir: Path, job_id: str | None) -> list[str]:
    """What the run dir says: finished / preempted / progress, checkpoint, logs."""
    from launcher.checkpoints import latest_complete_checkpoint

    lines = [f"run dir: {run_dir}"]
    result = _read_json(run_dir / RESULT_FILE)
    if result is not None and not (run_dir / PREEMPTED).exists():
        lines.append(
            f"run: finished at step {result.get('global_step')}"
            f" (final train loss {result.get('final_train_loss')}, world size"
            f" {result.get('world_size')}); model: {result.get('model_dir')}"
        )
    elif (run_dir / PREEMPTED).exists():
        stopped = _read_json(run_dir / PREEMPTED) or {}
        lines.append(f"run: stopped for preemption at step {stopped.get('step')}; requeued")
    else:
        lines.append(f"run: {_progress(run_dir)}")
    checkpoint = latest_complete_checkpoint(run_dir / "checkpoints")
    lines.append(f"latest complete checkpoint: {checkpoint or 'none yet'}")
    if job_id is not None:
        out, err = (path.replace("%j", job_id) for path in log_paths(run_dir))
        lines.append(f"logs: {out}  {err}")
    return lines


def _progress(run_dir: Path) -> str:
    metrics = run_dir / "metrics.jsonl"
    steps = []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                steps.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                continue
    if not steps:
        return "not started yet (or no step logged)"
    return f"running, step {steps[-1]}" + _max_steps_suffix(run_dir)


def _max_steps_suffix(run_dir: Path) -> str:
    from omegaconf import OmegaConf

    try:
        max_steps = int(OmegaConf.load(run_dir / "config.yaml").train.max_steps)
    except Exception:  # noqa: BLE001 - a missing/odd config only loses the "of N"
        return ""
    return f" of {max_steps}" if max_steps > 0 else ""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def cancel(target: str) -> int:
    job_id, run_dir = resolve_target(target)
    if job_id is None:
        raise ConfigError(f"{target}: no Slurm job recorded for this run dir (a dry run?).")
    scancel(job_id)
    where = f" (run dir {run_dir})" if run_dir else ""
    print(f"ftl cancel: cancelled job {job_id}{where}")
    return 0
