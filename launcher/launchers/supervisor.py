"""Which `ftl train` process started a local launch, so that its ranks notice when it is gone.

`ftl train` arms a parent-death SIGTERM in the launcher it starts (launcher/run/supervise.py):
after a kill -9 of `ftl train` torchrun passes that SIGTERM on to the ranks, which save and
stop. The deepspeed launcher on one node does not: its runner (`deepspeed`) installs its
forwarding handler only for pdsh, so the SIGTERM ends the runner alone while its launch.py
and the ranks train on, orphaned, to the last step (deepspeed 0.19.8). Such a launch
therefore names `ftl train` in FTL_SUPERVISOR, and its ranks take that process's end for a
stop request (launcher/rank/preempt.py).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import psutil

ENV = "FTL_SUPERVISOR"
SUPERVISOR_GONE = "ftl train gone"
"""The reason a stop records (RUN_DIR/preempted) when it came from the supervisor's end."""


@dataclass(frozen=True)
class Supervisor:
    host: str
    pid: int
    started: float
    """psutil's create_time: a recycled pid belongs to a process started later."""

    @classmethod
    def this_process(cls) -> Supervisor:
        return cls(socket.gethostname(), os.getpid(), psutil.Process().create_time())

    def env(self) -> dict[str, str]:
        return {ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Supervisor | None:
        """The supervisor named in the environment if it runs on this host; None otherwise
        (none named, or a rank on another node, where the pid means nothing)."""
        try:
            named = cls(**json.loads(environ[ENV]))
        except (KeyError, ValueError, TypeError):
            return None
        return named if named.host == socket.gethostname() else None

    @classmethod
    def launch_env(cls, environ: Mapping[str, str], forwards_stop: bool) -> dict[str, str]:
        """`environ` for a local launch: naming this process where the launcher does not
        forward a stop, and without an inherited FTL_SUPERVISOR where it does (an `ftl
        train` started from a rank's environment would take its ranks' end for its own)."""
        env = {key: value for key, value in environ.items() if key != ENV}
        return env if forwards_stop else {**env, **cls.this_process().env()}

    def alive(self) -> bool:
        try:
            return psutil.Process(self.pid).create_time() == self.started
        except psutil.Error:
            return False
