"""Stop at a step boundary with a complete checkpoint when asked (docs/design.md, "The
ranks"): RUN_DIR/preempt.requested (the Slurm job's USR1 trap touches it: `--signal=B:USR1`
reaches only the batch shell, not the ranks behind torchrun or deepspeed), SIGTERM/SIGINT
reaching the rank (`stop_on_signals`; a repeated one changes nothing: aborting at once is
`ftl train`'s job, a second Ctrl-C), or the end of the `ftl train` that started a launcher
which would not pass its SIGTERM on (launcher/launchers/supervisor.py).

The ranks agree by an all-reduce (MAX): one that saw the request a step later would enter
the save's collectives at another step and hang. They vote at the first step end, then
about every VOTE_EVERY_S at steps they all agree on, not every step: an all-reduce costs
0.5-2 ms per step on 2 CPU ranks (1-5 % of the tiny model's ~40 ms step,
bench/train_overhead.py), while Slurm's signal_grace_s is minutes.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.launchers.supervisor import SUPERVISOR_GONE, Supervisor
from launcher.rundir import Preempted, RunDir

VOTE_EVERY_S = 1.0
"""Target seconds between two votes (the stop comes at most about this late)."""
MAX_VOTE_INTERVAL = 100
"""Steps between two votes at most, however fast the steps."""

_received: str | None = None
"""The first stop signal this process received (its name)."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _stop_requested(signal.Signals(signum).name)


def _stop_requested(reason: str) -> None:
    global _received
    if _received is None:
        _received = reason
        print(f"[ftl] {_received}: saving a checkpoint at the next agreed step boundary, "
              "then stopping", flush=True)


def stop_on_signals() -> None:
    """From now on SIGTERM and SIGINT ask for a stop at a step boundary (main thread only:
    Python runs handlers there). Installed just before training: a signal earlier loses
    no work, so it keeps its default meaning."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _on_signal)


class PreemptCallback(TrainerCallback):
    """Save and stop at a step end once a stop is requested: at the next vote when there
    are several ranks, at once for one process (no group: the file at every step end)."""

    def __init__(self, run_dir: RunDir, supervisor: Supervisor | None = None) -> None:
        self.run_dir = run_dir
        self.supervisor = supervisor
        self.preempted = False
        self.next_vote = 0  # global step of the next vote (every rank computes the same)
        self._last_vote: tuple[int, float] | None = None  # (step, monotonic time)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.preempted:
            return
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            return  # the last step: the run finishes (and saves) now, nothing to resume
        if not _distributed():
            stop = self.requested()
        elif state.global_step < self.next_vote:
            return
        else:
            stop, interval = vote(self.requested(), self._proposed_interval(state.global_step))
            self.next_vote = state.global_step + interval
        if not stop:
            return
        self.preempted = True
        control.should_save = True
        control.should_training_stop = True
        if state.is_world_process_zero:
            if _received:  # now: the batch script requeues on it even if the save is cut short
                self.run_dir.preempt_requested.touch()
            print(f"[ftl] stop requested ({_reason()}): saving checkpoint-{state.global_step} "
                  "and stopping; a relaunch (or the requeued job) resumes from it", flush=True)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        """Rank 0: RUN_DIR/preempted once the checkpoint is complete (its marker comes
        before train end), so `ftl status` never reports one a kill cut short."""
        if self.preempted and state.is_world_process_zero:
            self.run_dir.write_preempted(Preempted(state.global_step, time.time(), _reason()))

    def _proposed_interval(self, step: int) -> int:
        """Steps until the next vote that this rank proposes: how many of its steps since
        the last vote fit in VOTE_EVERY_S (1 at the first vote: nothing measured yet)."""
        now = time.monotonic()
        last, self._last_vote = self._last_vote, (step, now)
        if last is None or step <= last[0] or now <= last[1]:
            return 1
        per_step = (now - last[1]) / (step - last[0])
        return max(1, min(MAX_VOTE_INTERVAL, int(VOTE_EVERY_S / per_step)))

    def requested(self) -> bool:
        if _received is None and self.supervisor is not None and not self.supervisor.alive():
            _stop_requested(SUPERVISOR_GONE)
        return _received is not None or self.run_dir.preempt_requested.exists()


def _reason() -> str:
    return _received or "preempt.requested"


def vote(flag: bool, interval: int) -> tuple[bool, int]:
    """One all-reduce (MAX) for both: stop if any rank saw the request, and the smallest
    proposed interval (the MAX of its negation). Every rank calls it at the same step."""
    value = torch.tensor([1 if flag else 0, -interval], dtype=torch.int64,
                         device=collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    stop, negative = value.tolist()
    return bool(stop), max(1, -int(negative))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def collective_device() -> torch.device:
    """Where a tensor for a collective must live: NCCL reduces CUDA tensors only, gloo
    (CPU) takes CPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
