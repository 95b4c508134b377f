"""`ftl train` watching its launcher: Ctrl-C and SIGTERM stop the ranks at a step boundary.

The launcher runs in a session of its own, so a terminal's Ctrl-C or a SIGTERM to `ftl
train`'s process group never reaches a launcher that would kill the ranks before they save
(torchrun and the deepspeed launcher give them 30 s, then SIGKILL); the protocol:
docs/design.md, "The ranks".
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType

import psutil

from launcher.rundir import RunDir

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class StopForwarder:
    """The signal handler: first signal -> stop request file; second -> kill everything."""

    run_dir: RunDir
    child: subprocess.Popen[bytes]
    stopping: bool = False
    aborted: bool = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self.stopping:
            self.stopping = True
            self.run_dir.preempt_requested.touch()
            print(f"ftl train: {name}: the ranks save a checkpoint at the next step boundary "
                  "and stop. Ctrl-C again aborts at once.", file=sys.stderr, flush=True)
            return
        if not self.aborted:
            self.aborted = True
            print(f"ftl train: {name} again: aborting", file=sys.stderr, flush=True)
            kill_tree(self.child.pid)


def kill_tree(pid: int) -> list[psutil.Process]:
    """SIGKILL a process and all its descendants (listed first: a killed parent's children
    are re-parented and could no longer be found); returns them, to wait for. torchrun
    starts each rank in a session of its own, so a process-group kill would miss them."""
    try:
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return []
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return tree


def term_when_parent_dies(parent: int) -> Callable[[], None]:
    """A preexec_fn: in the child, before exec, ask for SIGTERM when `parent` dies."""

    def arm() -> None:
        if sys.platform.startswith("linux"):
            # 1: PR_SET_PDEATHSIG (linux/prctl.h)
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the request was in place
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def supervise(argv: Sequence[str], env: Mapping[str, str], run_dir: RunDir) -> tuple[int, bool]:
    """Run the launcher in its own session until it exits, forwarding stop requests:
    (its exit status, whether a second signal aborted it)."""
    child = subprocess.Popen(list(argv), env=dict(env), start_new_session=True,
                             preexec_fn=term_when_parent_dies(os.getpid()))
    forwarder = StopForwarder(run_dir, child)
    previous = {signum: signal.signal(signum, forwarder.handle) for signum in STOP_SIGNALS}
    try:
        returncode = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return returncode, forwarder.aborted
