"""The COMPLETE marker that makes a checkpoint count (launcher/rundir/checkpoints.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.engines.final_model import barrier
from launcher.rank.memtrace import peak_memory_mib
from launcher.rundir import MetricsEvent, RunDir, write_complete_marker


class CheckpointCallback(TrainerCallback):
    """Marks a checkpoint COMPLETE once every rank has written its part; rank 0 records the
    save's seconds and bytes in metrics.jsonl, timed from the last step end, log or eval
    (the Trainer saves right after them) to the marker."""

    def __init__(self, tp: int = 1, sp: int = 1) -> None:
        self.since = time.monotonic()
        self.tp, self.sp = tp, sp

    def _mark(self, *args: Any, **kw: Any) -> None:
        self.since = time.monotonic()

    on_step_end = on_log = on_evaluate = _mark

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        barrier()  # every rank has returned from its part of the save
        if state.is_world_process_zero and checkpoint.is_dir():
            write_complete_marker(checkpoint, state.global_step, args.world_size, self.tp, self.sp)
            run_dir = RunDir(checkpoint.parent.parent)  # the Trainer's output_dir: checkpoints/
            size = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
            seconds = round(time.monotonic() - self.since, 3)
            run_dir.append_metrics(MetricsEvent(
                state.global_step, run_dir.current_launch(), time.time(), "save",
                {"seconds": seconds, "bytes": size}, peak_memory_mib()))
        barrier()  # nobody resumes or reads the marker before it exists
