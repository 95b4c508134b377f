"""The seam for batch schedulers: what `ftl submit`, `ftl status` and `ftl cancel` need
(docs/design.md, "The scheduler seam"), imported lazily (`ftl plan` loads none).

A running job is stopped through its run dir, not the scheduler (`ftl cancel`): the job
script must end without resubmitting itself when RUN_DIR/cancel.requested exists, and
exit launcher.rundir.STOPPED_EXIT when the ranks saved a complete checkpoint.
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from launcher.config.schema import RunConfig
from launcher.estimator.disk import SaveTime
from launcher.launchers.command import Launch

SCHEDULERS: dict[str, str] = {
    "slurm": "launcher.schedulers.slurm:SlurmScheduler",
}
"""cluster.scheduler value -> "module:Class"."""
DEFAULT_SCHEDULER = next(iter(SCHEDULERS))
"""The first entry: a bare `ftl submit` uses its cluster preset (configs/cluster/<name>.yaml,
named like the scheduler), and a bare job id is its job."""


@dataclass(frozen=True)
class JobInfo:
    """What a scheduler says about a job, in its own words where they differ."""

    job_id: str
    state: str
    """e.g. PENDING, RUNNING, COMPLETED, FAILED, CANCELLED."""
    exit_code: str = "?"
    restarts: str = "0"
    run_time: str = "?"
    nodes: str = "?"
    reason: str = "None"
    script: Path | None = None
    """The batch script the job runs; its directory is the run dir."""
    running: bool = False
    """Its job script is executing, so a stop request in the run dir reaches it."""


class Scheduler(Protocol):
    name: str

    def problems(self, cfg: RunConfig) -> list[str]:
        """Rules for a batch job on this scheduler, each naming key, value and fix."""

    def warnings(self, cfg: RunConfig, save: SaveTime) -> list[str]:
        """Risks the user may take, each naming key, value and fix; e.g. a stop signal whose
        grace time cannot cover `save` (measured on the resumed run, else estimated)."""

    def is_job_id(self, text: str) -> bool:
        """Whether `ftl status TEXT` / `ftl cancel TEXT` names one of its jobs."""

    def render(self, cfg: RunConfig, run_dir: Path, launch: Launch, tool_dir: Path | None) -> str:
        """The batch script's text (pure). tool_dir: prepended to PATH in the job."""

    def submit(self, script: Path) -> str:
        """Submit the script; return the job id. A refusal is a ConfigError."""

    def status(self, job_id: str) -> JobInfo | None:
        """None when the scheduler does not (or no longer) know the job."""

    def cancel(self, job_id: str) -> None:
        """End the job now (pending or running), without waiting for a checkpoint."""

    def cancel_command(self, job_id: str) -> str:
        """The command a user types to do what `cancel` does (named in `ftl cancel`'s
        output for a running job, which is stopped gracefully instead)."""


def get_scheduler(name: str) -> Scheduler:
    return pkgutil.resolve_name(SCHEDULERS[name])()
