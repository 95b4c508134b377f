"""Bench-only TrainerCallbacks, installed the same way in `ftl train` (through
`train.callbacks: [{_target_: bench.callbacks.StepClock, out: DIR}]`) and in the
hand-written baseline (bench/baseline_trainer.py), so both runs are timed by the same code.

StepClock records, on every rank, the monotonic time, the process's CPU time and the number
of input tokens this rank has trained on at each optimizer step's end, and the logged
losses (rank 0). Tokens are
counted by a forward pre-hook on the model (training forwards only: evaluation does not
count): local, no collective, a few integer additions per step. At the end each rank writes
OUT/clock-rank<R>.json. Nothing here changes the data, the order or the losses.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


class StepClock(TrainerCallback):
    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.tokens = 0
        # (global step, monotonic s, tokens, this process's CPU s: all its threads)
        self.steps: list[tuple[int, float, int, float]] = []
        self.losses: dict[int, float] = {}
        self.began = 0.0
        self.train_runtime: float | None = None
        self._hook: Any = None

    @torch.compiler.disable  # the compile row: counted eagerly, not traced (a guarded int)
    def _count(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        if not module.training:
            return
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        if ids is not None:
            self.tokens += int(ids.numel())

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: Any = None, **kw: Any) -> None:
        self.began = time.monotonic()
        if model is not None and self._hook is None:
            self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kw: Any) -> None:
        if torch.cuda.is_initialized():  # a GPU step ends when its kernels do, not at launch
            torch.cuda.synchronize()
        self.steps.append((state.global_step, time.monotonic(), self.tokens, time.process_time()))

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            self.losses[state.global_step] = float(logs["loss"])
        if logs and "train_runtime" in logs:  # the Trainer's own: train() start to end
            self.train_runtime = float(logs["train_runtime"])

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kw: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.out.mkdir(parents=True, exist_ok=True)
        record = {"rank": args.process_index, "world_size": args.world_size,
                  "began": self.began, "ended": time.monotonic(), "steps": self.steps,
                  "losses": self.losses, "train_runtime": self.train_runtime}
        (self.out / f"clock-rank{args.process_index}.json").write_text(json.dumps(record))


class StateBytes(TrainerCallback):
    """The model states one rank really holds: every live tensor (unique storages, found by
    the garbage collector) summed as the stepping torch optimizer starts its `at_step`-th
    step (Adam's moments exist from the first step on; activations are freed by then), the
    moment memory.engine_model_state_parts describes as params + grads + optimizer.
    Offloaded states count too (on CPU the host is the same memory). Tensors held only by
    C++ (DDP's reducer buckets) are invisible here. Writes OUT/state-rank<R>.json; costs one
    heap walk, once.
    """

    def __init__(self, out: str, at_step: int = 2) -> None:
        self.out = Path(out)
        self.at_step = at_step
        self.calls = 0
        self.bytes: int | None = None
        self._hook: Any = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, optimizer: Any = None, **kw: Any) -> None:
        from launcher.engines.deepspeed.universal import innermost_optimizer

        inner = innermost_optimizer(optimizer)
        if inner is not None and hasattr(inner, "register_step_pre_hook"):
            self._hook = inner.register_step_pre_hook(self._pre_step)

    def _pre_step(self, optimizer: Any, *_: Any) -> None:
        self.calls += 1
        if self.calls == self.at_step:
            self.bytes = live_tensor_bytes()
            self._hook.remove()

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kw: Any) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        record = {"rank": args.process_index, "model_state_bytes": self.bytes}
        (self.out / f"state-rank{args.process_index}.json").write_text(json.dumps(record))


def live_tensor_bytes() -> int:
    """Bytes of every distinct tensor storage reachable from Python objects."""
    import gc

    import torch

    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.device.type == "meta":
                continue
            storage = obj.untyped_storage()
            pointer = storage.data_ptr()
        except Exception:  # noqa: BLE001 - wrapper subclasses (DTensor), freed storages
            continue
        if pointer == 0 or pointer in seen:
            continue
        seen.add(pointer)
        total += storage.nbytes()
    return total


class NoFinalCheckpoint(TrainerCallback):
    """Skip the checkpoint the Trainer writes after the last step (bench/gpu.sh: a 1B model's
    optimizer states are ~17 GB per run, minutes of disk time that measure nothing here; the
    worker still saves the final model). Installed after the Trainer's DefaultFlowCallback,
    which asks for that save in its own on_step_end."""

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kw: Any) -> None:
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            control.should_save = False
