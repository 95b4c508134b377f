"""Tokens seen (`state.num_input_tokens_seen`): one all-reduce per read, not a gather per step."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.rank.preempt import collective_device


class TokenCounter(TrainerCallback):
    """`include_num_input_tokens_seen="all"` without a collective per micro-batch: the
    Trainer (transformers 5.24, `_track_num_input_tokens`) gathers each micro-batch's count
    from all ranks and reads it back, a blocking round trip per step (0.5-2 ms on 2 CPU
    ranks, bench/train_overhead.py). Here each rank counts its own, and the ranks sum them
    (one all-reduce) only at a step end after which something reads the count (a log, an
    eval, a save, the end): every rank decides alike from the control flags, which it sees
    last of all callbacks. Wherever the count is read it equals the Trainer's own."""

    def __init__(self) -> None:
        self.pending = 0

    @classmethod
    def install(cls, trainer: Any) -> TokenCounter | None:
        """Replace the Trainer's per-micro-batch gather (only for "all": the count is the
        input_ids' numel); None, and the Trainer counts as before, otherwise."""
        if (trainer.args.include_num_input_tokens_seen != "all"
                or not callable(getattr(trainer, "_track_num_input_tokens", None))):
            return None
        counter = cls()
        name = getattr(trainer.model, "main_input_name", "input_ids")
        trainer._track_num_input_tokens = lambda inputs: counter.track(inputs, name)
        trainer.add_callback(counter)  # last: after every callback that may set a flag
        return counter

    def track(self, inputs: dict[str, Any], name: str = "input_ids") -> None:
        if name in inputs:
            self.pending += int(inputs[name].numel())

    def sync(self, state: TrainerState) -> None:
        """Add every rank's tokens counted since the last sync (all ranks call it)."""
        total = self.pending
        if dist.is_available() and dist.is_initialized():
            value = torch.tensor(self.pending, dtype=torch.int64, device=collective_device())
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            total = int(value.item())
        state.num_input_tokens_seen = (state.num_input_tokens_seen or 0) + total
        self.pending = 0

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        """Sync when something reads the count after this step (or epoch) end."""
        if (control.should_log or control.should_evaluate or control.should_save
                or control.should_training_stop):
            self.sync(state)

    on_epoch_end = on_step_end

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.sync(state)
