"""What a run writes to disk: checkpoint and final-model sizes, for the pre-flight check.

Pure. A checkpoint holds the trainable weights in the model's dtype (LoRA: only the
adapter), AdamW's two fp32 moments per trainable parameter and, under DeepSpeed, the
optimizer's own fp32 copy of the weights (in fp32 too: measured on the tiny Llama, 16.9
bytes per parameter under zero3, 12.5 under ddp, small files included); the final model
is every weight in the model's dtype (fp32 here, or bf16 for a bf16 LoRA base:
launcher/rank/model.py `model_dtype`). Small files
(configs, RNG states, the scheduler) are left out: they are kilobytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from launcher.config.schema import RunConfig
from launcher.engines import engine_of
from launcher.rundir import RunDir


@dataclass(frozen=True)
class DiskNeed:
    checkpoint_bytes: int
    checkpoints: int
    """How many exist at once at most (a lower bound when `exact` is False)."""
    final_model_bytes: int
    exact: bool

    @property
    def total_bytes(self) -> int:
        return self.checkpoints * self.checkpoint_bytes + self.final_model_bytes


def weight_bytes(cfg: RunConfig) -> int:
    return 2 if cfg.peft.name == "lora" and cfg.precision.name == "bf16" else 4


def checkpoint_bytes(cfg: RunConfig, params: int, trainable: int) -> int:
    saved = trainable if cfg.peft.name != "none" else params
    master = 4 if engine_of(cfg.strategy).separate_master_weights else 0
    return saved * weight_bytes(cfg) + trainable * (8 + master)


def checkpoints_kept(cfg: RunConfig) -> tuple[int, bool]:
    """(count, exact): train.save_total_limit, else every save of a step-counted run. For an
    epoch-counted run without a limit the count is unknown before the data is: 1."""
    t = cfg.train
    if t.save_total_limit > 0:
        # The Trainer deletes the oldest only after writing the newest: limit + 1 at once.
        return t.save_total_limit + 1, True
    if t.max_steps > 0:
        return max(1, math.ceil(t.max_steps / max(t.save_steps, 1))), True
    return 1, False


def disk_need(cfg: RunConfig, params: int, trainable: int) -> DiskNeed:
    count, exact = checkpoints_kept(cfg)
    return DiskNeed(checkpoint_bytes(cfg, params, trainable), count,
                    params * weight_bytes(cfg), exact)


WRITE_BYTES_PER_S = 200e6
"""Assumed checkpoint write speed before a save has been measured: a conservative figure
for a shared cluster filesystem (local NVMe is 10x faster, a busy NFS can be slower)."""


@dataclass(frozen=True)
class SaveTime:
    seconds: float
    source: str
    """How it was found: "estimated: N GB at 200 MB/s" or "measured: step N of RUN_DIR"."""


def save_time_estimate(cfg: RunConfig, params: int, trainable: int) -> SaveTime:
    size = checkpoint_bytes(cfg, params, trainable)
    return SaveTime(size / WRITE_BYTES_PER_S,
                    f"estimated: {size / 1e9:.2f} GB at {WRITE_BYTES_PER_S / 1e6:.0f} MB/s")


def measured_save_time(run_dir: Path) -> SaveTime | None:
    """The last save a run measured (metrics.jsonl {"event": "save"}, rank 0's
    CheckpointCallback): the time from its step's end to its COMPLETE marker."""
    saves = [event for event in RunDir(run_dir).read_metrics() if event.kind == "save"]
    if not saves:
        return None
    return SaveTime(float(saves[-1].values["seconds"]),
                    f"measured: the save of step {saves[-1].step} in {run_dir}")
