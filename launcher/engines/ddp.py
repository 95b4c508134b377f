"""torch DDP: every rank holds the whole model, gradients and optimizer state. Its rules
and peak-memory moments; everything else is the default of launcher/engines/base.py."""

from __future__ import annotations

from typing import ClassVar

from launcher.config.schema import RunConfig, StrategyConfig
from launcher.engines.base import Engine, zero_stage_unused
from launcher.engines.peak_terms import (
    LoraInputs,
    PeakInputs,
    Split,
    adam_temporaries,
    shifted,
    trainable_view,
)


class DdpEngine(Engine):
    name: ClassVar[str] = "ddp"
    shards: ClassVar[bool] = False

    def problems(self, cfg: RunConfig) -> list[str]:
        strategy, problems = cfg.strategy, zero_stage_unused(cfg.strategy)
        if strategy.offload_param or strategy.offload_optimizer:
            problems.append(
                f"strategy={strategy.name} with offload: DDP keeps everything on the GPU. "
                "Fix: strategy=zero2_offload, zero3_offload or fsdp_offload.")
        return problems

    def memory_stage(self, strategy: StrategyConfig) -> int:
        return 0

    def moments(self, x: PeakInputs, strategy: StrategyConfig) -> dict[str, Split]:
        return ddp_moments(x)

    def lora_moments(self, x: PeakInputs, lo: LoraInputs,
                     strategy: StrategyConfig) -> dict[str, Split]:
        return lora_ddp_moments(x, lo)


def ddp_moments(x: PeakInputs) -> dict[str, Split]:
    """torch DDP: fp32 weights whatever the precision (autocast casts), reducer buckets
    holding a copy of every grad (4psi; accelerate wraps no DDP on one process), Adam 8psi;
    .grad is None between steps."""
    psi = x.psi
    buckets = 4.0 * psi if x.n > 1 else 0.0
    between = 12.0 * psi + buckets
    # autocast caches a 16-bit copy of each weight during the forward (measured, cpu bf16:
    # forward end = 16psi + 2psi + acts + autocast_acts to 0.6 %)
    autocast = 2.0 * psi if x.p == 2 else 0.0
    held = 4.0 * psi if x.grad_accum > 1 else 0.0  # grads kept across micro batches
    forward = between + held + autocast + x.acts + x.autocast_acts + x.recompute
    # autocast drops its cache when the forward's context exits, and the backward frees
    # the 16-bit copies it saved as it fills .grad (measured, cpu bf16: 20psi at its end)
    fwd_bwd = max(forward, between + 4.0 * psi)
    optimizer = between + 4.0 * psi + adam_temporaries(x, x.largest_tensor, flat=False)
    return {"construction": (4.0 * psi + buckets, 0.0), "between_steps": (between, 0.0),
            "forward_backward": (fwd_bwd, 0.0), "optimizer_step": (optimizer, 0.0),
            "checkpoint": (between, 0.0), "checkpoint_other_ranks": (between, 0.0)}


def lora_ddp_moments(x: PeakInputs, lo: LoraInputs) -> dict[str, Split]:
    """DDP: the base's p_b*psi + ddp_moments over the adapters (4a params, 4a buckets, 8a
    Adam). Construction held the model twice (measured 826.4M = 2 x 413.2M, not
    attributed: DDP's broadcast of the module states is the candidate). The Trainer's
    checkpoint saves the adapters only; the final save clones the base on rank 0 to merge."""
    moments = shifted(ddp_moments(trainable_view(x, lo)), lo.base_bytes * x.psi)
    if x.p == 2 and lo.base_bytes == 4:  # fp32 base under fp16 autocast (derived): the
        # forward saves a 16-bit copy of each frozen weight for the backward, which frees
        # them (autocast caches only weights that require grad; measured for ddp in bf16:
        # nothing of it is left between steps, docs/evidence/memory.md section 11)
        d, h = moments["forward_backward"]
        moments["forward_backward"] = (d + 2.0 * x.psi + x.autocast_acts, h)
    between = moments["between_steps"]
    return {**moments, "construction": (2.0 * lo.model(x.psi), 0.0),
            "checkpoint": between, "checkpoint_other_ranks": between,
            # rank 0 saves from the live model: a clone of every base weight, merged into
            "final": (between[0], between[1] + (lo.base_bytes * x.psi + lo.merge_temporaries)),
            "final_other_ranks": between}
