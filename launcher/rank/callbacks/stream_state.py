"""A streaming run's checkpoint holds where its first untrained row is read from (the
stream's position in every source, launcher/data/stream.py), so a resumed launch reads on
from there instead of reading and tokenizing the trained rows again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.data.stream import StreamRows
from launcher.rundir import write_stream_state


class StreamState(TrainerCallback):
    """Ahead of CheckpointCallback: the file is in the checkpoint before it counts."""

    def __init__(self, rows: StreamRows) -> None:
        self.rows = rows

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not state.is_world_process_zero or not checkpoint.is_dir():
            return
        # Every rank reads every row and keeps its slice of each global batch.
        trained = (state.global_step * args.per_device_train_batch_size
                   * args.gradient_accumulation_steps * args.world_size)
        write_stream_state(checkpoint, self.rows.state_before(trained))
