"""Progress for the hang watchdog (launcher/rank/watchdog.py): every optimizer step, eval
batch and finished save is a beat; train end stops the watchdog (the final eval and save
after it are outside its bound)."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.rank.watchdog import Watchdog


class ProgressBeat(TrainerCallback):
    """Installed first (before any callback that could block: its beat at a step end comes
    before theirs), so `step` in a hang record is the rank's last completed step."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.watchdog.step = state.global_step  # a resumed launch's start, not yet a beat

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.watchdog.beat(state.global_step)

    def on_prediction_step(self, *args: Any, **kw: Any) -> None:
        self.watchdog.beat()  # an eval batch; a finished save (on_save) alike

    on_save = on_prediction_step

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.watchdog.stop()
