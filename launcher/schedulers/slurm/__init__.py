"""Slurm, the first `Scheduler` (launcher/schedulers/base.py), and the only code that knows Slurm:
its rules (rules.py), the job script (script.py, pure text) and, here, the only sbatch /
scontrol / scancel calls (a missing client or a refusal is a ConfigError naming the fix).
Its settings: `cluster.slurm.*`."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from launcher.errors import ConfigError
from launcher.schedulers.base import JobInfo
from launcher.schedulers.slurm.rules import grace_warnings, slurm_problems
from launcher.schedulers.slurm.script import render_sbatch


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ConfigError(
            f"`{argv[0]}` not found: this machine has no Slurm client. Fix: run on the "
            "cluster's login node, or `ftl submit --dry-run` to see the job script."
        ) from None


def sbatch(script: Path) -> str:
    """Submit; returns the job id. sbatch's refusal (bad partition, ...) is a ConfigError."""
    done = _run(["sbatch", "--parsable", str(script)])
    if done.returncode != 0:
        raise ConfigError(
            f"sbatch refused {script}: {done.stderr.strip() or done.stdout.strip()}. "
            "Fix: check cluster.slurm.partition / account / qos / time."
        )
    return done.stdout.strip().split(";")[0]  # --parsable: "ID" or "ID;CLUSTER"


def show_job(job_id: str) -> dict[str, str] | None:
    """`scontrol show job -o`, as a dict; None when Slurm does not (or no longer) know it."""
    done = _run(["scontrol", "show", "job", "-o", job_id])
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return parse_scontrol(done.stdout.strip().splitlines()[0])


def parse_scontrol(line: str) -> dict[str, str]:
    """`Key=Value Key2=Value with spaces ...` -> dict (values may contain spaces)."""
    pieces = re.split(r" (?=[A-Za-z][A-Za-z0-9_:/]*=)", line.strip())
    return dict(piece.split("=", 1) for piece in pieces if "=" in piece)


def scancel(job_id: str) -> None:
    done = _run(["scancel", job_id])
    if done.returncode != 0:
        raise ConfigError(f"scancel {job_id}: {done.stderr.strip()}")


class SlurmScheduler:
    """launcher.schedulers.base.Scheduler for Slurm."""

    name = "slurm"

    problems = staticmethod(slurm_problems)
    warnings = staticmethod(grace_warnings)
    render = staticmethod(render_sbatch)
    submit = staticmethod(sbatch)
    cancel = staticmethod(scancel)

    def is_job_id(self, text: str) -> bool:
        return text.replace("_", "").isdigit()  # 1234, or 1234_5 for an array task

    def status(self, job_id: str) -> JobInfo | None:
        info = show_job(job_id)
        if info is None:
            return None
        command = info.get("Command", "")
        return JobInfo(
            job_id=job_id,
            state=info.get("JobState", "?"),
            exit_code=info.get("ExitCode", "?"),
            restarts=info.get("Restarts", "0"),
            run_time=info.get("RunTime", "?"),
            nodes=info.get("NodeList", "?"),
            reason=info.get("Reason", "None"),
            script=Path(command) if command.startswith("/") else None,
            running=info.get("JobState") == "RUNNING",
        )

    def cancel_command(self, job_id: str) -> str:
        return f"scancel {shlex.quote(job_id)}"
