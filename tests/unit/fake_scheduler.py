"""A second scheduler for tests: one module behind launcher.schedulers.base's interface, which is
all a new scheduler (PBS, LSF, Kubernetes) takes. It "submits" by recording the script,
under job ids that are not numbers."""

from __future__ import annotations

import shlex
from pathlib import Path

from launcher.config.schema import RunConfig
from launcher.estimator.disk import SaveTime
from launcher.launchers.command import Launch, render_argv
from launcher.schedulers.base import JobInfo

SUBMITTED: dict[str, Path] = {}
CANCELLED: list[str] = []
RUNNING: dict[str, str] = {}
"""Jobs a test declares running (id -> state shown), whose script would honour a stop."""


class FakeScheduler:
    name = "fake"

    def problems(self, cfg: RunConfig) -> list[str]:
        if cfg.cluster.nodes > 4:
            return [f"cluster.nodes={cfg.cluster.nodes}: the fake cluster has 4 nodes. "
                    "Fix: cluster.nodes=4 or fewer."]
        return []

    def warnings(self, cfg: RunConfig, save: SaveTime) -> list[str]:
        if cfg.cluster.nodes == 4:
            return ["cluster.nodes=4: the whole fake cluster; other jobs wait. "
                    "Fix: cluster.nodes=3 or fewer."]
        return []

    def is_job_id(self, text: str) -> bool:
        return text.startswith("fake-")

    def render(
        self, cfg: RunConfig, run_dir: Path, launch: Launch, tool_dir: Path | None
    ) -> str:
        return f"#!/bin/sh\n# fake job for {shlex.quote(str(run_dir))}\n" \
               f"{render_argv(launch.argv, launch.shell_vars)}\n"

    def submit(self, script: Path) -> str:
        job_id = f"fake-{len(SUBMITTED) + 100}"
        SUBMITTED[job_id] = script
        return job_id

    def status(self, job_id: str) -> JobInfo | None:
        script = SUBMITTED.get(job_id)
        if script is None:
            return None
        state = "CANCELLED" if job_id in CANCELLED else RUNNING.get(job_id, "PENDING")
        return JobInfo(job_id=job_id, state=state, script=script, running=job_id in RUNNING)

    def cancel(self, job_id: str) -> None:
        CANCELLED.append(job_id)

    def cancel_command(self, job_id: str) -> str:
        return f"fake-cancel {job_id}"
