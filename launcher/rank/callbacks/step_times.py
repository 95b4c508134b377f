"""Per-rank busy time per optimizer step, for stragglers (`ftl report`).

In a synchronous data-parallel step every rank's wall time is the same: the fast ranks
wait for the slowest in the gradient collective. What differs is how long each rank
worked before it could start waiting. Measured here: from the step's begin (on_step_begin;
the Trainer's token-count gather just before it lines the ranks up) to the end of this
rank's own backward, the moment its autograd accumulates the gradient of the first
trainable parameter (the input embedding, or the first adapter with LoRA), which the
backward computes last. Under DDP and ZeRO-1 the gradient all-reduces run asynchronously
beside the backward and are waited for only after it (DDP's reducer finalizes after the
last gradient), so this is the rank's own data transfer, forward and backward: the
slowest rank has the largest figure and each other rank waited about the difference.
Under ZeRO-2/3 a bucket's reduce inside the backward can block, so part of a wait is
counted as busy and a straggler shows smaller than it is; FSDP2 accumulates into its
own unsharded parameters, so no figure is recorded there (the report says so).

Cost: one gradient hook on one parameter and a clock read at step begin and end; on
GPUs two CUDA events per step, read at the step end (the Trainer has already waited for
the backward there: its NaN check of the loss). The figures of all ranks meet at each
train log (one small all-gather every train.logging_steps, in MetricsCallback.on_log).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist

from launcher.rank.preempt import collective_device


class StepTimes:
    """Busy seconds of this rank's steps since the last `gather`."""

    def __init__(self) -> None:
        self.busy_s = 0.0
        self.steps = 0
        self._on_gpu = False
        self._begin: Any = None
        self._end: Any = None
        self._handle: Any = None

    def attach(self, model: torch.nn.Module) -> None:
        first = next((p for p in model.parameters() if p.requires_grad), None)
        if first is None or self._handle is not None:
            return
        self._on_gpu = first.device.type == "cuda"
        self._handle = first.register_post_accumulate_grad_hook(self._backward_done)

    def _stamp(self) -> Any:
        if not self._on_gpu:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def step_begin(self) -> None:
        self._begin, self._end = self._stamp(), None

    def _backward_done(self, param: torch.Tensor) -> None:
        self._end = self._stamp()  # the last micro batch's backward ends the step's work

    def step_end(self) -> None:
        begin, end = self._begin, self._end
        self._begin = self._end = None
        if begin is None or end is None:
            return
        if self._on_gpu:
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1000
        else:
            seconds = end - begin
        self.busy_s += seconds
        self.steps += 1

    def gather(self) -> tuple[list[float], int]:
        """Every rank's mean busy seconds per step since the last gather (NaN where none
        was measured) and the steps counted; a collective: every rank calls it at the
        same log."""
        mean = self.busy_s / self.steps if self.steps else math.nan
        steps, self.busy_s, self.steps = self.steps, 0.0, 0
        if not (dist.is_available() and dist.is_initialized()):
            return [mean], steps
        mine = torch.tensor([mean], dtype=torch.float64, device=collective_device())
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        return [float(t.item()) for t in every], steps
