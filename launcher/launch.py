"""The local-launch edge: checks that look at this machine, the run dir on disk, and the
launcher subprocess. Everything it decides comes from the pure planner."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from launcher.checkpoints import RESUME_FROM_FILE, latest_in_earlier_runs
from launcher.command import Launch
from launcher.compose import compose_config
from launcher.errors import ConfigError
from launcher.planner import Plan, make_plan, plan_launch, resolve_tool, run_dir_files
from launcher.rundir import new_run_dir_path, write_run_dir
from launcher.schema import RunConfig

HUB_HOST = "huggingface.co"


def prepare(overrides: list[str], *, launching_locally: bool) -> tuple[Plan, Path, Launch]:
    """Compose, validate, plan and (only if all is well) write the run dir."""
    cfg = compose_config(overrides)
    if not launching_locally:
        plan = make_plan(cfg)
    else:
        # Report the configuration's problems and this machine's together, in one error.
        problems: list[str] = []
        try:
            plan = make_plan(cfg, launching_locally=True)
        except ConfigError as error:
            problems += error.problems
            plan = None
        problems += machine_problems(plan.cfg if plan else cfg, plan)
        if problems or plan is None:
            raise ConfigError(problems)
    run_dir = new_run_dir_path(plan.cfg.run.output_dir, plan.cfg.run.name).resolve()
    launch = plan_launch(plan, run_dir)
    files = run_dir_files(plan, launch, overrides)
    earlier = earlier_checkpoint(plan.cfg, run_dir)
    if earlier is not None:
        files[RESUME_FROM_FILE] = f"{earlier}\n"
        print(f"ftl: run.resume=auto continues from {earlier}", file=sys.stderr)
    write_run_dir(run_dir, files, executable=("launch.sh",))
    return plan, run_dir, launch


def earlier_checkpoint(cfg: RunConfig, run_dir: Path) -> Path | None:
    if cfg.run.resume != "auto":
        return None
    return latest_in_earlier_runs(run_dir.parent, exclude=run_dir)


def machine_problems(cfg: RunConfig, plan: Plan | None) -> list[str]:
    """What stops this machine from running the plan, each with the next step."""
    problems = []
    if cfg.cluster.gpu != "cpu" and shutil.which("nvidia-smi") is None:
        problems.append(
            f"cluster.gpu={cfg.cluster.gpu}: this machine has no NVIDIA GPU. Fix: "
            "cluster.gpu=cpu to train here, or `ftl submit cluster=slurm ...` on a GPU cluster."
        )
    problems += _missing_sources(cfg)
    problems += _unreadable_data(cfg)
    estimate = plan.estimate if plan else None
    if estimate is not None and not estimate.get("fits", True) and not cfg.run.force:
        gib = estimate["gpu_bytes"] / 1024**3
        problems.append(
            f"strategy={cfg.strategy.name}: the plan needs {gib:.1f} GiB per device, more than "
            f"cluster.gpu={cfg.cluster.gpu} has. Fix: see `ftl estimate` for a strategy that "
            "fits (or strategy=auto), peft=lora, more GPUs, or run.force=true to try anyway."
        )
    resume = cfg.run.resume
    if resume not in ("auto", "never") and not Path(resume).is_dir():
        problems.append(
            f"run.resume={resume}: no such checkpoint directory. "
            "Fix: run.resume=auto, run.resume=never, or the path of a checkpoint-N directory."
        )
    return problems


def _missing_sources(cfg: RunConfig) -> list[str]:
    sources = [
        ("model.path", cfg.model.path),
        ("model.tokenizer", cfg.model.tokenizer),
        ("dataset.path", cfg.dataset.path),
        ("dataset.eval_path", cfg.dataset.eval_path),
    ]
    remote = [(key, value) for key, value in sources if value and not Path(value).exists()]
    if not remote or hub_reachable():
        return []
    return [
        f"{key}={value}: not found on this machine, and the HF hub is unreachable from here. "
        f"Fix: download it and set {key}=/local/path, or `ftl submit` where the hub is "
        "reachable; `ftl plan` shows the plan without running it."
        for key, value in remote
    ]


def _unreadable_data(cfg: RunConfig) -> list[str]:
    """Read local data files once here, so a bad file fails before any rank starts."""
    import datasets

    from launcher.data import load_records
    from launcher.errors import DataError

    datasets.disable_progress_bars()
    problems = []
    for key, path in (("dataset.path", cfg.dataset.path), ("dataset.eval_path",
                                                           cfg.dataset.eval_path)):
        if not path or not Path(path).is_file():
            continue
        try:
            load_records(path, cfg.dataset.format)
        except (DataError, ConfigError) as error:
            problems.append(f"{key}={path}: {error}")
    return problems


def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        return False
    try:
        socket.create_connection((HUB_HOST, 443), timeout=3).close()
    except OSError:
        return False
    return True


def run_local(plan: Plan, run_dir: Path, launch: Launch) -> int:
    """Start the launcher; on failure say which rank failed and where its log is."""
    print(f"ftl train: run dir {run_dir} (per-rank logs in {run_dir / 'logs'})", flush=True)
    env = {**os.environ, **launch.env}
    returncode = subprocess.call(resolve_tool(launch.argv), env=env)
    if returncode == 0 and (run_dir / "result.json").is_file():
        print(f"ftl train: done. Model: {run_dir / 'model'}", flush=True)
        return 0
    if returncode == 0:
        print(
            "ftl train: stopped before the last step, after a complete checkpoint in "
            f"{run_dir / 'checkpoints'}; the same `ftl train` command again resumes from it "
            "(run.resume=auto).",
            flush=True,
        )
        return 0
    print(failure_report(run_dir, returncode), file=sys.stderr)
    return 1


def failure_report(run_dir: Path, returncode: int) -> str:
    errors = sorted((run_dir / "logs").glob("rank*.error"))
    if not errors:
        return (
            f"ftl train: the launcher exited with code {returncode} and no rank reported an "
            f"error (killed or crashed at start?). Logs: {run_dir / 'logs'}"
        )
    lines = [f"ftl train: the run failed (launcher exit code {returncode})."]
    for error_file in errors:
        text = error_file.read_text().strip().splitlines()
        rank = error_file.stem.removeprefix("rank")
        lines.append(f"  rank {rank}: {text[-1] if text else '?'}  (traceback: {error_file})")
    lines.append(f"  per-rank logs: {run_dir / 'logs'}")
    return "\n".join(lines)
