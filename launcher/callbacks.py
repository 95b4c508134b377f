"""Trainer callbacks the worker installs: launch record, metrics, checkpoint marker.

Callbacks run on every rank; only rank 0 writes files, but every rank must reach the
same barriers, so nothing here returns early before a collective.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher import memtrace, timing
from launcher.checkpoints import write_complete_marker
from launcher.preempt import collective_device
from launcher.rundir import RunDir


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
    each rank writes its own peak memory to RUN_DIR/metrics/rank<R>.json.

    Every launch (first start, requeue, `ftl train` again) is one line of launches.jsonl:
    which checkpoint it resumed from and the step it started at, and each metrics line
    names its launch, so a resume can never be mistaken for a restart from step 0.
    FLOPs per token and the device peak come from plan.json.

    At the end of each launch's first step rank 0 prints where its start-up went
    ("[ftl] start-up: ...") and appends it to metrics.jsonl as {"event": "startup"}; the
    worker adds {"event": "finish"} after the final eval and save (launcher/timing.py)."""

    def __init__(self, run_dir: RunDir, flops_per_token: float,
                 peak_flops_per_device: float | None, resumed_from: str | None) -> None:
        self.run_dir = run_dir
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops_per_device
        self.resumed_from = resumed_from
        self.launch = 0
        self._last: tuple[float, int] | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        timing.mark("train_begin")
        if not state.is_world_process_zero:
            return
        path = self.run_dir.launches
        self.launch = len(path.read_text().splitlines()) if path.is_file() else 0
        record = {"launch": self.launch, "time": time.time(), "world_size": args.world_size,
                  "resumed_from": self.resumed_from, "start_step": state.global_step}
        with path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

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
        record: dict[str, Any] = {"step": state.global_step, "launch": self.launch,
                                  "time": time.time(), **logs}
        self._append(record)
        print(progress_line(record, state.max_steps), flush=True)

    def _append(self, record: dict[str, Any]) -> None:
        with self.run_dir.metrics.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    def record_phases(self, event: str, figures: dict[str, float], state: TrainerState) -> None:
        """Rank 0: one metrics.jsonl line {"event": "startup"|"finish", event: {phase: s}}
        (launcher/timing.py) and its console line."""
        if not state.is_world_process_zero:
            return
        self._append({"step": state.global_step, "launch": self.launch, "time": time.time(),
                      "event": event, event: figures,
                      "peak_memory_mib": round(peak_memory_mib(), 1)})
        line = timing.startup_line if event == "startup" else timing.finish_line
        print(line(figures), flush=True)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if not timing.MARKS.has("first_step"):
            timing.mark("first_eval")  # train.eval_on_start: before the first step
        memtrace.rename("eval", only="steady")  # an eval between steps

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        memtrace.phase("steady" if timing.MARKS.has("first_step") else "first_step")

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        memtrace.rename("checkpoint")  # the gap after this step held a checkpoint save

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        memtrace.phase("steady")  # logging, eval, save until the next step: renamed if so
        if state.global_step >= state.max_steps:
            timing.mark("last_step")
        if timing.MARKS.has("first_step"):
            return
        timing.mark("first_step")  # this launch's first step: its start-up is complete
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
        out = self.run_dir.rank_metrics
        out.mkdir(exist_ok=True)
        record = {"rank": args.process_index, "peak_memory_mib": round(peak_memory_mib(), 1),
                  "tokens_seen": int(state.num_input_tokens_seen or 0)}
        (out / f"rank{args.process_index}.json").write_text(json.dumps(record) + "\n")


class TokenCounter(TrainerCallback):
    """`include_num_input_tokens_seen="all"` without a collective per micro-batch.

    The Trainer (transformers 5.24, `_track_num_input_tokens`) gathers every micro-batch's
    input-token count from all ranks and reads it back (`.item()`): a blocking round trip
    per step, about 0.5-2 ms on 2 CPU ranks (bench/train_overhead.py). Installed with
    `install`, this rank counts its own tokens and the ranks sum them (one all-reduce) only
    at a step end after which something reads `state.num_input_tokens_seen`: a log, an
    eval, a checkpoint, the end of training; every rank decides alike from the same
    control flags, which it sees last of all callbacks. The count at every one of those
    points, in the logs, checkpoints and result, equals the Trainer's own."""

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

    def _sync_if_read(self, state: TrainerState, control: TrainerControl) -> None:
        if (control.should_log or control.should_evaluate or control.should_save
                or control.should_training_stop):
            self.sync(state)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._sync_if_read(state, control)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._sync_if_read(state, control)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.sync(state)


def record_finish(trainer: Any) -> None:
    """After the final eval and save: their phases, like the start-up's (rank 0)."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, MetricsCallback):
            callback.record_phases("finish", timing.finish(), trainer.state)


def record_memory(trainer: Any, run_dir: RunDir) -> dict[str, Any]:
    """Every rank, after the final save: its live-tensor peaks per phase into
    metrics/rank<R>.json ("memory", launcher/memtrace.py); returns result.json's "memory"
    with every rank's figures (one all_gather_object)."""
    mine = memtrace.summary()
    rank = trainer.args.process_index
    path = run_dir.rank_metrics / f"rank{rank}.json"
    record = json.loads(path.read_text()) if path.is_file() else {"rank": rank}
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({**record, "memory": mine}) + "\n")
    ranks = [mine]
    if dist.is_available() and dist.is_initialized():
        ranks = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(ranks, mine)
    plan = json.loads(run_dir.plan.read_text())
    predicted = (plan.get("estimate") or {}).get("peak_bytes")  # live tensor bytes, as measured
    return {"predicted_peak_bytes": int(predicted) if predicted else None,
            "measured_peak_bytes": [r.get("peak_bytes") for r in ranks],
            "measured_rss_bytes": [r.get("rss_peak_bytes") for r in ranks]}


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
    """Marks a checkpoint COMPLETE once every rank has written its part, and rank 0 records
    how long the save took in metrics.jsonl ({"event": "save", "seconds", "bytes"}): the
    Trainer saves right after a step's end, log and eval, so the save ran from the last of
    those to the marker. `ftl submit` compares it with the signal's grace time."""

    def __init__(self) -> None:
        self.since = time.monotonic()

    def _mark(self, *args: Any, **kw: Any) -> None:
        self.since = time.monotonic()

    on_step_end = on_log = on_evaluate = _mark

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        barrier()  # every rank has returned from its part of the save
        if state.is_world_process_zero and checkpoint.is_dir():
            write_complete_marker(checkpoint, state.global_step, args.world_size)
            self._record(checkpoint, state.global_step)
        barrier()  # nobody resumes or reads the marker before it exists

    def _record(self, checkpoint: Path, step: int) -> None:
        """Like every metrics.jsonl line: step, launch (this launch's launches.jsonl line,
        written at train begin), time, peak memory."""
        run_dir = RunDir(checkpoint.parent.parent)
        lines = run_dir.launches.read_text().splitlines() if run_dir.launches.is_file() else []
        launch = max(0, len(lines) - 1)
        size = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
        record = {"step": step, "launch": launch, "time": time.time(), "event": "save",
                  "seconds": round(time.monotonic() - self.since, 3), "bytes": size,
                  "peak_memory_mib": round(peak_memory_mib(), 1)}
        with run_dir.metrics.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


class UntiedOptimizerSteps(TrainerCallback):
    """Installed only on a resume from a universal checkpoint: once DeepSpeed has loaded
    it (before the first step), every optimizer state gets its own step count
    (launcher/universal.untie_optimizer_steps says why)."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        from launcher.engines.deepspeed.universal import untie_optimizer_steps

        untie_optimizer_steps(kw.get("optimizer"))
