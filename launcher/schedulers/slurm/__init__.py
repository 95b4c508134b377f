"""Slurm, the first `Scheduler` (launcher/schedulers/base.py), and the only code that knows Slurm:
its rules (rules.py), the job script (script.py, pure text) and the sbatch / scontrol /
scancel calls (client.py). Its settings: `cluster.slurm.*`."""

from __future__ import annotations

import shlex
from pathlib import Path

from launcher.schedulers.base import JobInfo
from launcher.schedulers.slurm.client import sbatch, scancel, show_job
from launcher.schedulers.slurm.rules import grace_warnings, slurm_problems
from launcher.schedulers.slurm.script import render_sbatch


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
