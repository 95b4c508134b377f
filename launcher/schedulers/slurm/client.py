"""The only sbatch / scontrol / scancel calls. A missing client or a refusal is a
ConfigError naming the fix; `scontrol show job` output is parsed here."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from launcher.errors import ConfigError


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
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
