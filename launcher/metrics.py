"""Live run metrics: tokens/s, achieved TFLOP/s and MFU, peak memory per rank.

The callback adds its figures to the Trainer's log dict, so TensorBoard and the run dir's
metrics.jsonl record them with the loss; each rank also writes its own peak memory to
RUN_DIR/metrics/rank<R>.json at the end (read by `ftl report`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback


def peak_memory_bytes() -> int:
    """Peak device memory on GPU; on CPU the process's peak resident set."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


class MetricsCallback(TrainerCallback):
    """Throughput from the Trainer's token count; MFU = achieved / (devices x peak)."""

    def __init__(self, run_dir: Path, params: int, world_size: int,
                 peak_flops_per_device: float | None, rank: int) -> None:
        self.run_dir, self.params, self.world_size = run_dir, params, world_size
        self.peak_flops = peak_flops_per_device
        self.rank = rank
        self._last: tuple[float, int] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._last = (time.perf_counter(), state.num_input_tokens_seen)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
               **kwargs: Any) -> None:
        if logs is None or self._last is None or "loss" not in logs:
            return
        now, tokens = time.perf_counter(), state.num_input_tokens_seen
        seconds, new_tokens = now - self._last[0], tokens - self._last[1]
        self._last = (now, tokens)
        if seconds <= 0 or new_tokens <= 0:
            return
        tokens_per_s = new_tokens / seconds
        achieved = 6 * self.params * tokens_per_s  # C = 6PD over the interval
        logs["tokens_per_s"] = round(tokens_per_s, 2)
        logs["tflops"] = round(achieved / 1e12, 6)
        if self.peak_flops:
            logs["mfu"] = round(achieved / (self.world_size * self.peak_flops), 6)
        logs["peak_memory_gib"] = round(peak_memory_bytes() / 1024**3, 4)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        out = self.run_dir / "metrics"
        out.mkdir(exist_ok=True)
        record = {"rank": self.rank, "peak_memory_bytes": peak_memory_bytes(),
                  "pid": os.getpid(), "tokens_seen": state.num_input_tokens_seen}
        (out / f"rank{self.rank}.json").write_text(json.dumps(record) + "\n")
