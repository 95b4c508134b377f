"""Live metrics of each launch: its launches.jsonl record, every log event, its start-up
and finish phases in metrics.jsonl, and each rank's peak at train end."""

from __future__ import annotations

import math
import time
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher import timing
from launcher.rank import memtrace
from launcher.rank.callbacks.step_times import StepTimes
from launcher.rundir import MetricsEvent, RankMetrics, RunDir


class MetricsCallback(TrainerCallback):
    """Adds tokens/s, TFLOP/s, MFU (GPU only: a CPU has no meaningful peak) and peak memory
    to every rank's log dict (installed first: TensorBoard records them with the loss).
    Rank 0 appends each log to metrics.jsonl with every rank's step times (step_times.py)
    and prints a progress line; each launch is a launches.jsonl line that every metrics
    line names, so a resume is never taken for a restart."""

    def __init__(self, run_dir: RunDir, flops_per_token: float,
                 peak_flops_per_device: float | None, resumed_from: str | None) -> None:
        self.run_dir = run_dir
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops_per_device
        self.resumed_from = resumed_from
        self.launch = 0
        self._last: tuple[float, int] | None = None
        self.step_times = StepTimes()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        timing.mark("train_begin")
        note_compiled(args, "train_begin")
        if kw.get("model") is not None:
            self.step_times.attach(kw["model"])
        if not state.is_world_process_zero:
            return
        self.launch = self.run_dir.record_launch(
            args.world_size, self.resumed_from, state.global_step).launch

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
        logs["peak_memory_mib"] = memtrace.peak_memory_mib()
        # Every rank logs the training loss at the same steps: the busy times meet there.
        times = self.step_times.gather() if "loss" in logs else None
        if not state.is_world_process_zero:
            return
        values = {k: v for k, v in logs.items() if k != "peak_memory_mib"}
        if times is not None and times[2]:
            busy, forward, steps = times
            values.update(rank_busy_s=_rounded(busy), rank_forward_s=_rounded(forward),
                          busy_steps=steps)
        event = self._event("log", values, state, logs["peak_memory_mib"])
        self.run_dir.append_metrics(event)
        print(progress_line(event, state.max_steps), flush=True)

    def _event(self, kind: str, values: dict[str, Any], state: TrainerState,
               peak_mib: float) -> MetricsEvent:
        return MetricsEvent(state.global_step, self.launch, time.time(), kind, values, peak_mib)

    def record_phases(self, event: str, figures: dict[str, float], state: TrainerState) -> None:
        """Rank 0: one metrics.jsonl line {"event": "startup"|"finish", event: {phase: s}}
        (launcher/timing.py) and its console line."""
        if not state.is_world_process_zero:
            return
        self.run_dir.append_metrics(self._event(event, figures, state, memtrace.peak_memory_mib()))
        line = timing.startup_line if event == "startup" else timing.finish_line
        print(line(figures), flush=True)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if not timing.MARKS.has("first_step"):
            timing.mark("first_eval")  # train.eval_on_start: before the first step
            note_compiled(args, "first_eval")
        memtrace.PHASES.rename("eval", only="steady")  # an eval between steps

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        memtrace.PHASES.phase("steady" if timing.MARKS.has("first_step") else "first_step")
        self.step_times.step_begin()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        memtrace.PHASES.rename("checkpoint")  # the gap after this step held a checkpoint save

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.step_times.step_end()
        memtrace.PHASES.phase("steady")  # logging, eval, save until the next step: renamed if so
        if state.global_step >= state.max_steps:
            timing.mark("last_step")
        if timing.MARKS.has("first_step"):
            return
        timing.mark("first_step")  # this launch's first step: its start-up is complete
        note_compiled(args, "first_step")
        self.record_phases("startup", timing.rank_startup(str(self.run_dir.path)), state)

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
        self.run_dir.write_rank_metrics(RankMetrics(
            args.process_index, memtrace.peak_memory_mib(),
            int(state.num_input_tokens_seen or 0)))


def note_compiled(args: TrainingArguments, mark: str) -> None:
    """train.compile: what torch.compile has spent by this mark (timing.move_compile)."""
    if args.torch_compile:
        timing.MARKS.note_compiled(mark, compile_seconds())


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process: dynamo's own count of
    every frame's compile and of its backward graphs, which inductor builds at the first
    backward (torch._dynamo.utils, private: 0 where a torch has no such count)."""
    try:
        from torch._dynamo.utils import calculate_time_spent
    except ImportError:
        return 0.0
    return float(calculate_time_spent().get("total_wall_time", 0.0))


def _rounded(seconds: list[float]) -> list[float | None]:
    """Per rank, for metrics.jsonl: None where nothing was measured (JSON has no NaN)."""
    return [None if math.isnan(s) else round(s, 5) for s in seconds]


def record_finish(trainer: Any) -> None:
    """After the final eval and save: their phases, like the start-up's (rank 0)."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, MetricsCallback):
            callback.record_phases("finish", timing.finish(), trainer.state)


PROGRESS = (("loss", "loss {:.4f}"), ("aux_loss", "aux_loss {:.3f}"),
            ("learning_rate", "lr {:.2e}"),
            ("eval_loss", "eval_loss {:.4f}"), ("rewards/accuracies", "reward acc {:.2f}"),
            ("eval_rewards/accuracies", "eval reward acc {:.2f}"),
            ("train_runtime", "training done in {:.1f} s"),
            ("train_loss", "mean loss {:.4f}"), ("tokens_per_s", "{:.0f} tok/s"),
            ("mfu", "MFU {:.1%}"))
"""The progress line's fields, in order (train_*: only the end-of-training summary;
rewards: TRL's DPOTrainer; aux_loss: an MoE run's router loss, router_loss.py)."""


def progress_line(event: MetricsEvent, max_steps: int) -> str:
    """e.g. `[ftl] step 40/564  loss 3.1250  lr 2.00e-03  5210 tok/s  peak 512 MiB`."""
    parts = [f"[ftl] step {event.step}/{max_steps}"]
    # TRL's trainers add train_runtime to every step's log; it ends only the summary line
    summary = "loss" not in event.values
    parts += [form.format(event.values[key]) for key, form in PROGRESS
              if key in event.values and (summary or not key.startswith("train_"))]
    parts.append(f"peak {event.peak_memory_mib:.0f} MiB")
    return "  ".join(parts)
