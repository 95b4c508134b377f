"""DeepSpeed only (a universal-checkpoint resume); the engine module will own it."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


class UntiedOptimizerSteps(TrainerCallback):
    """Installed only on a resume from a universal checkpoint: once DeepSpeed has loaded
    it (before the first step), every optimizer state gets its own step count
    (launcher/universal.untie_optimizer_steps says why)."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        from launcher.universal import untie_optimizer_steps

        untie_optimizer_steps(kw.get("optimizer"))
