"""Trainer callbacks the worker installs: metrics file, checkpoint marker, clean stop.

Callbacks run on every rank; only rank 0 writes files, but every rank must reach the
same barriers, so nothing here returns early before a collective.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.checkpoints import write_complete_marker

# Test and operations knob: stop cleanly right after the checkpoint of this step is complete
# (simulates a preemption at a known point, so a resumed run can be compared step by step).
STOP_AFTER_STEP_ENV = "FTL_STOP_AFTER_STEP"


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def peak_memory_mib() -> float:
    """Peak accelerator memory of this rank, or peak resident memory on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class MetricsCallback(TrainerCallback):
    """Live metrics. On every rank it adds tokens/s, achieved TFLOP/s, MFU (GPU only: a CPU
    has no meaningful peak) and peak memory to the Trainer's log dict; the worker installs
    it first, so TensorBoard records these with the loss. Rank 0 also appends the log to
    RUN_DIR/metrics.jsonl and prints a one-line progress report (the worker turns tqdm off:
    bars from several ranks, teed through the launcher, garble the console). At the end
    each rank writes its own peak memory to RUN_DIR/metrics/rank<R>.json."""

    def __init__(self, run_dir: Path, flops_per_token: float,
                 peak_flops_per_device: float | None) -> None:
        self.run_dir = run_dir
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops_per_device
        self._last: tuple[float, int] | None = None

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs:
            return
        self._add_throughput(logs, int(state.num_input_tokens_seen or 0), args.world_size)
        logs["peak_memory_mib"] = round(peak_memory_mib(), 1)
        if not state.is_world_process_zero:
            return
        record: dict[str, Any] = {"step": state.global_step, "time": time.time(), **logs}
        with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
        print(progress_line(record, state.max_steps), flush=True)

    def _add_throughput(self, logs: dict[str, Any], tokens: int, world_size: int) -> None:
        """Since the previous log event that saw new tokens (all ranks together; the
        Trainer's own train_tokens_per_second averages over the whole run)."""
        now = time.time()
        if self._last is not None and tokens > self._last[1] and now > self._last[0]:
            tokens_per_s = (tokens - self._last[1]) / (now - self._last[0])
            achieved = self.flops_per_token * tokens_per_s
            logs["tokens_per_s"] = tokens_per_s
            logs["tflops"] = achieved / 1e12
            if self.peak_flops:
                logs["mfu"] = achieved / (world_size * self.peak_flops)
        if self._last is None or tokens > self._last[1]:
            self._last = (now, tokens)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        out = self.run_dir / "metrics"
        out.mkdir(exist_ok=True)
        record = {"rank": args.process_index, "peak_memory_mib": round(peak_memory_mib(), 1),
                  "tokens_seen": int(state.num_input_tokens_seen or 0)}
        (out / f"rank{args.process_index}.json").write_text(json.dumps(record) + "\n")


def progress_line(record: dict[str, Any], max_steps: int) -> str:
    """e.g. `[ftl] step 40/564  loss 3.1250  lr 2.00e-03  5210 tok/s  peak 512 MiB`."""
    parts = [f"[ftl] step {record['step']}/{max_steps}"]
    if "loss" in record:
        parts.append(f"loss {record['loss']:.4f}")
    if "learning_rate" in record:
        parts.append(f"lr {record['learning_rate']:.2e}")
    if "eval_loss" in record:
        parts.append(f"eval_loss {record['eval_loss']:.4f}")
    if "train_loss" in record:  # only the end-of-training summary has the mean loss
        parts.append(f"training done in {record['train_runtime']:.1f} s")
        parts.append(f"mean loss {record['train_loss']:.4f}")
    if "tokens_per_s" in record:
        parts.append(f"{record['tokens_per_s']:.0f} tok/s")
    if "mfu" in record:
        parts.append(f"MFU {record['mfu']:.1%}")
    parts.append(f"peak {record['peak_memory_mib']:.0f} MiB")
    return "  ".join(parts)


class CheckpointCallback(TrainerCallback):
    """Marks a checkpoint COMPLETE once every rank has written its part.

    With FTL_STOP_AFTER_STEP=N it also stops training right after step N's checkpoint is
    complete, like a preemption at a known step (Slurm preemption: launcher/preempt.py).
    """

    def __init__(self, stop_after_step: int | None = None) -> None:
        self.stop_after_step = stop_after_step

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        barrier()  # every rank has returned from its part of the save
        if state.is_world_process_zero and checkpoint.is_dir():
            write_complete_marker(checkpoint, state.global_step, args.world_size)
        barrier()  # nobody resumes or reads the marker before it exists
        if self.stop_after_step is not None and state.global_step >= self.stop_after_step:
            control.should_training_stop = True


def stop_after_step_from_env() -> int | None:
    value = os.environ.get(STOP_AFTER_STEP_ENV, "")
    return int(value) if value else None


class ShardProbe(Dataset):
    """Wraps the train dataset and records which sample indices this rank loads.

    Evidence that data is sharded: with 2 ranks the index sets are disjoint and each rank
    sees about half the samples. Only the first `limit` indices are kept.
    """

    def __init__(self, dataset: Any, limit: int = 100_000) -> None:
        self.dataset = dataset
        self.limit = limit
        self.seen: list[int] = []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if len(self.seen) < self.limit:
            self.seen.append(int(index))
        return self.dataset[index]


class DataloaderProbe(TrainerCallback):
    """Records this rank's number of train batches per epoch (sharded: N / (micro x world))."""

    def __init__(self) -> None:
        self.batches_per_epoch: int | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        loader = kw.get("train_dataloader")
        if loader is not None:
            try:
                self.batches_per_epoch = len(loader)
            except TypeError:  # an iterable dataset has no length
                self.batches_per_epoch = None
