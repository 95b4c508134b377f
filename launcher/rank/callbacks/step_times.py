"""Per-rank busy and forward seconds per optimizer step, for stragglers (`ftl report`).

In a synchronous data-parallel step every rank's wall time is the same (the fast ones wait in
a collective), so what is measured is how long each rank worked before it had to wait, from
on_step_begin (the Trainer's token-count gather just before it lines the ranks up). Busy: to
the end of the rank's own backward (a post-accumulate-grad hook on the first trainable
parameter, whose gradient the backward computes last). Forward: the time inside the model's
forward passes, summed over the micro batches. Under DDP the bucket all-reduces are waited
for after the last gradient, so busy is the rank's own work and the others waited the
slowest's busy minus their own. DeepSpeed ZeRO-1/2 reduces block inside the backward and even
out the busy figures, but its forward runs no collective, so a slow device shows there. Under
ZeRO-3 and FSDP2 the forward's all-gathers line the ranks up too, and neither figure tells
them apart (docs/evidence/stack.md). A rank slow outside the step (a callback at the step end,
data loading) shows in neither: the others wait for it in the next step's gather.

Cost: a gradient hook on one parameter, a forward pre-hook and hook on the model, a clock
read (GPU: a CUDA event) each, and one all-gather of two numbers per train log. On a GPU the
events are read at that log, never at a step end: no host synchronisation per step.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist

from launcher.rank.preempt import collective_device


class StepTimes:
    """This rank's busy and forward seconds per step since the last `gather`."""

    def __init__(self) -> None:
        self.busy_s = self.forward_s = 0.0
        self.steps = 0
        self._on_gpu = False
        self._begin: Any = None
        self._end: Any = None
        self._forward_start: Any = None
        self._forwards: list[tuple[Any, Any]] = []
        self._handles: list[Any] = []
        self._pending: list[tuple[Any, Any, list[tuple[Any, Any]]]] = []

    def attach(self, model: torch.nn.Module) -> None:
        first = next((p for p in model.parameters() if p.requires_grad), None)
        if first is None or self._handles:
            return
        # Where the steps run, not where the first parameter lives: under FSDP with CPU
        # offload the sharded parameters stay on the host while every step runs on the GPU.
        self._on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._handles = [first.register_post_accumulate_grad_hook(self._backward_done),
                         model.register_forward_pre_hook(self._forward_begins),
                         model.register_forward_hook(self._forward_ends)]

    def _stamp(self) -> Any:
        if not self._on_gpu:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _seconds(self, begin: Any, end: Any) -> float:
        if not self._on_gpu:
            return float(end - begin)
        end.synchronize()
        return float(begin.elapsed_time(end)) / 1000

    def step_begin(self) -> None:
        self._begin, self._end, self._forwards = self._stamp(), None, []

    # The hooks run on the model that train.compile compiles, and dynamo would trace them:
    # a CUDA event made inside a graph, a Python float it may guard on. Kept eager.
    @torch.compiler.disable
    def _forward_begins(self, module: torch.nn.Module, inputs: Any) -> None:
        if module.training and self._begin is not None:  # not an eval between steps
            self._forward_start = self._stamp()

    @torch.compiler.disable
    def _forward_ends(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if self._forward_start is not None:
            self._forwards.append((self._forward_start, self._stamp()))
            self._forward_start = None

    def _backward_done(self, param: torch.Tensor) -> None:
        self._end = self._stamp()  # the last micro batch's backward ends the step's work

    def step_end(self) -> None:
        begin, end, forwards = self._begin, self._end, self._forwards
        self._begin, self._end, self._forwards = None, None, []
        if begin is None or end is None:
            return
        self.steps += 1
        if self._on_gpu:  # read at the gather: reading an event now would wait for the GPU
            self._pending.append((begin, end, forwards))
            return
        self.busy_s += self._seconds(begin, end)
        self.forward_s += sum(self._seconds(a, b) for a, b in forwards)

    def _resolve(self) -> None:
        """The GPU steps' seconds, at a log: the Trainer has just read the loss there (a host
        synchronisation of its own), so these events are done and no step waits for them."""
        for begin, end, forwards in self._pending:
            self.busy_s += self._seconds(begin, end)
            self.forward_s += sum(self._seconds(a, b) for a, b in forwards)
        self._pending = []

    def gather(self) -> tuple[list[float], list[float], int]:
        """Every rank's mean busy and forward seconds per step since the last gather
        (NaN where none was measured) and the steps counted; a collective: every rank
        calls it at the same log."""
        self._resolve()
        steps = self.steps
        means = [self.busy_s / steps, self.forward_s / steps] if steps else [math.nan] * 2
        self.busy_s = self.forward_s = 0.0
        self.steps = 0
        if not (dist.is_available() and dist.is_initialized()):
            return [means[0]], [means[1]], steps
        mine = torch.tensor(means, dtype=torch.float64, device=collective_device())
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        rows = [t.tolist() for t in every]
        return [r[0] for r in rows], [r[1] for r in rows], steps
