"""Slurm's rules for a batch job (`cluster.slurm.*`), each naming the key, the value and the
fix; they join the one validation stage through `SlurmScheduler.problems` / `.warnings`."""

from __future__ import annotations

import math
import re
import shlex

from launcher.config.schema import RunConfig
from launcher.errors import flagged
from launcher.estimator.disk import SaveTime

SLURM_SIGNAL_MAX_S = 65535
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2})$")
_UNLIMITED = ("UNLIMITED", "INFINITE")
_MEM = re.compile(r"^\d+[KMGT]?$")


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
        (slurm.mem and not _MEM.match(slurm.mem),
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
        if _CONTROL.search(value):
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
