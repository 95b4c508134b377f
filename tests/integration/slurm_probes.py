"""A probe for tests/integration/test_slurm.py (its own module, so that the test module
does not import transformers): injected through `train.callbacks` like tests/integration/
probes.py's, it runs on every rank of a real Slurm job."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.rundir import RunDir


def waiting_marker(restart: int, rank: int) -> str:
    """RUN_DIR/probes/<this> exists once that rank waits in WaitForStop."""
    return f"waiting-restart{restart}-rank{rank}"


class WaitForStop(TrainerCallback):
    """At its launch's first step end, every rank waits until RUN_DIR/preempt.requested
    exists (at most timeout_s), after writing RUN_DIR/probes/waiting-restart<N>-rank<R>.

    Only in the Slurm launch whose SLURM_RESTART_COUNT (0 when unset) is `restart`. The
    ranks vote on a stop at the first step end of a launch (before this callback: the
    worker's own callbacks come first) and again at the next step (launcher/rank/preempt.py), so
    a request made while they wait stops the run at exactly the step after the first one,
    however slow the machine. Nothing here touches the data or the losses.
    """

    def __init__(self, restart: int = 0, timeout_s: float = 600.0) -> None:
        self.restart = restart
        self.timeout_s = timeout_s
        self.done = False

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.done or int(os.environ.get("SLURM_RESTART_COUNT", 0)) != self.restart:
            return
        self.done = True
        run_dir = RunDir(Path(args.output_dir).parent)  # output_dir: RUN_DIR/checkpoints
        probes = run_dir.probes
        probes.mkdir(parents=True, exist_ok=True)
        marker = probes / waiting_marker(self.restart, args.process_index)
        marker.write_text(f"{state.global_step}\n")
        deadline = time.monotonic() + self.timeout_s
        while not run_dir.preempt_requested.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
