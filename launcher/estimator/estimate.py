"""What a run will cost before any GPU is touched: FLOPs, time, and per-GPU memory under
every strategy of the table, computed once per plan (flops.py, memory.py and peak.py side
by side): `ftl estimate` renders it, `strategy=auto` picks a row, the plan keeps its row.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from launcher.config.architecture import count_params
from launcher.config.hardware import gpu_preset
from launcher.config.schema import RunConfig, StrategyConfig
from launcher.config.strategies import concrete_strategies, is_auto, with_user_settings
from launcher.engines.parallel_rules import parallel_engine_problems
from launcher.estimator.flops import run_flops, run_seconds, trainable_params, training_tokens
from launcher.estimator.inference import InferenceEstimate, inference_estimate
from launcher.estimator.memory import (
    CPU_FRAMEWORK_BUFFER_BYTES,
    FIT_FRACTION,
    FRAMEWORK_BUFFER_BYTES,
    GIB,
    model_state_bytes,
    reference_bytes,
    reference_placement,
)
from launcher.estimator.peak import predict_peak


@dataclass
class StrategyEstimate:
    strategy: str
    model_state_gpu_bytes: float
    """Model states the device holds in the optimizer step (the peak model's moment:
    launcher/estimator/peak.py, PeakPrediction.states_bytes), at most peak_bytes."""
    activation_bytes: float
    peak_bytes: float
    """Predicted per-rank peak of live tensor bytes over the whole run (rank 0): what
    result.json's measured_peak_bytes measures (launcher/estimator/peak.py)."""
    steady_bytes: float
    """The same over a training step (first and steady-state steps)."""
    moments: dict[str, float]
    """Moment (peak.MOMENTS; LoRA also final, final_other_ranks) -> live tensor bytes."""
    construction_above_training: bool
    buffer_bytes: float
    """Framework allowance (runtime, CUDA context, communication): not tensor bytes."""
    gpu_bytes: float
    gpu_capacity_bytes: float
    host_bytes: float
    """Host RAM per node (offloaded states)."""
    host_capacity_bytes: float | None
    fits_gpu: bool
    fits_host: bool
    fits: bool
    est_seconds: float | None
    host_peak_bytes: float = 0.0
    """GPU presets: the most host-side tensor bytes one rank holds at a moment (offloaded
    states, a checkpoint gathered on rank 0's host: FSDP FULL_STATE_DICT, ZeRO-3's 16-bit
    save); not in the host fit check. 0 on the cpu preset, where peak_bytes counts them."""
    reference_bytes: float = 0.0
    """objective=dpo: the frozen reference model's bytes per GPU while training (in
    model_state_gpu_bytes; on the host under ZeRO-3 offload_param, then in host_bytes
    instead); 0 when none is held (objective=sft, LoRA/QLoRA, precompute_ref_log_probs)."""
    reference: str = ""
    """objective=dpo: where the reference lives, in words; "" for objective=sft."""


@dataclass
class Estimate:
    model: str
    params: int
    trainable_params: int
    tokens: int | None
    flops: float | None
    est_seconds: float | None
    gpu_hours: float | None
    precision: str
    cluster: dict
    strategy: str
    """The configured strategy (may be `auto`)."""
    strategies: list[StrategyEstimate]
    inference: InferenceEstimate
    """The trained model on one device for `ftl eval`/`ftl chat` (estimator/inference.py)."""

    def row(self, name: str) -> StrategyEstimate | None:
        """The row of strategy `name`, or None when the table has no such strategy (`auto`)."""
        return next((r for r in self.strategies if r.strategy == name), None)


def strategy_estimate(
    cfg: RunConfig, strategy: StrategyConfig, seconds: float | None
) -> StrategyEstimate:
    """Memory and fit of cfg's run under `strategy` (the time is the same for every row)."""
    host = model_state_bytes(cfg, strategy)[1]
    peak = predict_peak(cfg, strategy)
    preset = gpu_preset(cfg.cluster.gpu)
    buffers = CPU_FRAMEWORK_BUFFER_BYTES if preset.is_cpu else FRAMEWORK_BUFFER_BYTES
    gpu = peak.peak_bytes + buffers
    # what one rank may use: on gpu=cpu the host's share per process
    capacity = (preset.memory_gib / cfg.cluster.gpus_per_node if preset.is_cpu
                else preset.memory_gib) * GIB
    gib = cfg.cluster.host_memory_gib  # 0: unknown, not checked
    host_cap = gib * GIB if gib > 0 else None
    fits_gpu = gpu <= FIT_FRACTION * capacity
    fits_host = host_cap is None or host <= host_cap
    return StrategyEstimate(
        strategy.name, peak.states_bytes, peak.acts, peak.peak_bytes, peak.steady_bytes,
        peak.moments, peak.construction_above_training, buffers, gpu, capacity, host,
        host_cap, fits_gpu, fits_host, fits_gpu and fits_host, seconds, peak.host_bytes,
        reference_bytes(cfg, strategy)[0], reference_placement(cfg, strategy),
    )


def row_strategies(cfg: RunConfig) -> list[StrategyConfig]:
    """One entry per concrete strategy of the table, in table order; the configured one is
    cfg.strategy itself, so its overrides show in its row (one missing from the table, e.g.
    from an older run dir's config.yaml, gets a row of its own at the end)."""
    table = concrete_strategies()
    if not is_auto(cfg.strategy):
        table[cfg.strategy.name] = copy.deepcopy(cfg.strategy)
    else:  # strategy=auto: what its resolve would run (e.g. bucket_size)
        table = {n: with_user_settings(s, cfg.strategy) for n, s in table.items()}
    if (cfg.parallel.tp, cfg.parallel.sp) != (1, 1):  # only the strategies that support it
        table = {n: s for n, s in table.items()
                 if not parallel_engine_problems(replace(cfg, strategy=s))}
    return list(table.values())


def estimate(cfg: RunConfig, tokens: int | None = None) -> Estimate:
    """Every strategy's memory on cfg's cluster, plus FLOPs and time for the whole run
    (`tokens`, e.g. counted from the data, overrides the config's figure)."""
    tokens = tokens if tokens is not None else training_tokens(cfg)
    flops = seconds = hours = None
    if tokens is not None:
        flops = run_flops(cfg, tokens)
        seconds = run_seconds(cfg, flops)
        hours = seconds * cfg.world_size / 3600
    rows = [strategy_estimate(cfg, s, seconds) for s in row_strategies(cfg)]
    cluster = {
        "nodes": cfg.cluster.nodes, "gpus_per_node": cfg.cluster.gpus_per_node,
        "world_size": cfg.world_size, "gpu": cfg.cluster.gpu,
        "gpu_memory_gib": gpu_preset(cfg.cluster.gpu).memory_gib,
        "host_memory_gib": cfg.cluster.host_memory_gib,
    }
    return Estimate(
        cfg.model.name, count_params(cfg.model), trainable_params(cfg), tokens, flops, seconds,
        hours, cfg.precision.name, cluster, cfg.strategy.name, rows, inference_estimate(cfg),
    )
