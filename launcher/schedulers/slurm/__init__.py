"""Slurm, the first `Scheduler` (launcher/schedulers/base.py), and the only code that knows Slurm:
the job script (script.py, pure text) and, here, its rules for a batch job (each naming the
key, the value and the fix) and the only sbatch / scontrol / scancel calls (a missing
client or a refusal is a ConfigError naming the fix). Its settings: `cluster.slurm.*`."""

from __future__ import annotations

import math
import re
import shlex
import subprocess
from pathlib import Path

from launcher.config.schema import RunConfig
from launcher.errors import ConfigError, flagged
from launcher.estimator.disk import SaveTime
from launcher.schedulers.base import JobInfo
from launcher.schedulers.slurm.script import render_sbatch

SLURM_SIGNAL_MAX_S = 65535
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2})$")
_UNLIMITED = ("UNLIMITED", "INFINITE")


def slurm_problems(cfg: RunConfig) -> list[str]:
    slurm = cfg.cluster.slurm
    time_ok = _TIME.match(slurm.time) or slurm.time.upper() in _UNLIMITED
    grace_max = min(time_seconds(slurm.time), SLURM_SIGNAL_MAX_S) if time_ok else 0
    return flagged([
        (not time_ok,
         f"cluster.slurm.time={slurm.time}: not a Slurm time limit. "
         "Fix: MINUTES, HH:MM:SS or D-HH:MM:SS, e.g. cluster.slurm.time=04:00:00."),
        (time_ok and not 0 < slurm.signal_grace_s < grace_max,
         f"cluster.slurm.signal_grace_s={slurm.signal_grace_s}: the warning before the "
         f"time limit must be between 1 s and the job's time (cluster.slurm.time="
         f"{slurm.time}) and at most {SLURM_SIGNAL_MAX_S} s. "
         "Fix: e.g. cluster.slurm.signal_grace_s=120."),
        (slurm.max_restarts < 0,
         f"cluster.slurm.max_restarts={slurm.max_restarts}: must be 0 or more. "
         "Fix: cluster.slurm.max_restarts=3 (0: never requeue)."),
        (slurm.cpus_per_task < 0,
         f"cluster.slurm.cpus_per_task={slurm.cpus_per_task}: must be 0 (Slurm's default) "
         "or more. Fix: e.g. cluster.slurm.cpus_per_task=32."),
        (slurm.mem and not re.match(r"^\d+[KMGT]?$", slurm.mem),
         f"cluster.slurm.mem={slurm.mem}: not a Slurm memory size. Fix: e.g. "
         "cluster.slurm.mem=500G, or cluster.slurm.mem=0 for all of a node's memory."),
    ]) + _text_problems(cfg)


def _text_problems(cfg: RunConfig) -> list[str]:
    cluster, problems = cfg.cluster, []
    values = {
        "run.name": cfg.run.name, "run.output_dir": cfg.run.output_dir,
        "cluster.slurm.partition": cluster.slurm.partition,
        "cluster.slurm.account": cluster.slurm.account,
        "cluster.slurm.qos": cluster.slurm.qos,
        **{f"cluster.slurm.sbatch_extra[{i}]": v
           for i, v in enumerate(cluster.slurm.sbatch_extra)},
        **{f"cluster.setup[{i}]": v for i, v in enumerate(cluster.setup)},
    }
    for key, value in values.items():
        if re.search(r"[\x00-\x1f\x7f]", value):
            problems.append(
                f"{key}={value!r}: contains a control character (newline, tab, ...), which "
                "would break the job script. Fix: remove it (one cluster.setup item per line)."
            )
    for index, extra in enumerate(cluster.slurm.sbatch_extra):
        try:
            tokens = shlex.split(extra)
        except ValueError as error:
            tokens, reason = [], str(error)
        else:
            reason = "an sbatch option must start with -"
        if not tokens or not tokens[0].startswith("-"):
            problems.append(
                f"cluster.slurm.sbatch_extra[{index}]={extra!r}: {reason}. "
                "Fix: an option as typed after `sbatch`, e.g. '--constraint=a100'."
            )
    return problems


def time_seconds(limit: str) -> int:
    """Slurm time limit -> seconds (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)."""
    if limit.upper() in _UNLIMITED:
        return 2**31
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if not days and len(parts) < 3:  # MM or MM:SS
        parts = [0, *parts]
    hours, minutes, seconds = [*parts, 0, 0][:3]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def grace_warnings(cfg: RunConfig, save: SaveTime) -> list[str]:
    """The USR1 before the time limit must leave time to reach a step boundary and save a
    checkpoint; a stop that runs out of grace is killed. A warning: the save time is a
    measurement of another launch or an estimate, and the user may accept the risk."""
    grace = cfg.cluster.slurm.signal_grace_s
    if save.seconds <= grace:
        return []
    suggested = int(math.ceil(2 * save.seconds / 60.0)) * 60
    return [
        f"cluster.slurm.signal_grace_s={grace} may be too short: saving a checkpoint takes "
        f"about {save.seconds:.0f} s ({save.source}), plus up to one step to reach a step "
        "boundary; a stop that runs out of grace is killed and loses the steps since the "
        f"last checkpoint. Fix: cluster.slurm.signal_grace_s={suggested}."
    ]


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
