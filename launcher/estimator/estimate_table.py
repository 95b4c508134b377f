"""`ftl estimate` output: the fixed-width table and the --json document of one Estimate,
given the strategy the caller chose (configured, or strategy=auto's pick): nothing here
computes an estimate."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from launcher.config.architecture import active_params, is_moe
from launcher.config.hardware import gpu_preset
from launcher.config.objectives import is_dpo
from launcher.config.schema import RunConfig
from launcher.estimator.estimate import Estimate
from launcher.estimator.flops import expert_gradient_params, lora_coverage, run_flops_factor
from launcher.estimator.memory import FIT_FRACTION, GIB, micro_sequences, rank_sequence


def estimate_json(est: Estimate, chosen: str | None,
                  checkpointed: bool = False) -> dict[str, Any]:
    """`ftl estimate --json`: the Estimate as plain JSON types, plus the chosen strategy
    (None: strategy=auto found nothing that fits) and whether strategy=auto turned
    train.gradient_checkpointing on for it (the rows are the run's as configured)."""
    return {**asdict(est), "chosen": chosen, "chosen_with_checkpointing": checkpointed}


def render_estimate_table(cfg: RunConfig, est: Estimate, chosen: str | None,
                          notes: list[str] | None = None) -> str:
    """Every strategy's row, the chosen one marked `*`, under a header naming the run;
    `notes` after the choice (auto.pick_notes)."""
    big = max(r.gpu_bytes for r in est.strategies) >= GIB
    unit, size = ("GiB", GIB) if big else ("MiB", 1024**2)
    lines = [*_header(cfg, est), ""]
    dpo = is_dpo(cfg)  # a column of the reference's bytes, within states
    lines.append(
        f"  {'strategy':<14}{'states ' + unit:>11}" + (f"{'ref ' + unit:>9}" if dpo else "")
        + f"{'activ. ' + unit:>11}{'peak ' + unit:>11}"
        f"{'total ' + unit:>11}{'fits':>6}{'host ' + unit + '/node':>15}{'time':>10}"
    )
    for row in est.strategies:
        mark = "*" if row.strategy == chosen else " "
        fits = "yes" if row.fits else ("no" if not row.fits_gpu else "host")
        peak = f"{row.peak_bytes / size:.2f}" + ("c" if row.construction_above_training else "")
        lines.append(
            f"{mark} {row.strategy:<14}{row.model_state_gpu_bytes / size:>11.2f}"
            + (f"{row.reference_bytes / size:>9.2f}" if dpo else "")
            + f"{row.activation_bytes / size:>11.2f}{peak:>11}{row.gpu_bytes / size:>11.2f}"
            f"{fits:>6}{row.host_bytes / size:>15.1f}{_duration(row.est_seconds):>10}"
        )
    if any(row.construction_above_training for row in est.strategies):
        lines.append("  c: model construction (build + engine wrapping) peaks above training")
    if dpo:
        lines += _reference_lines(est)
    lines += [_inference_line(cfg, est), "", _chosen_line(cfg, chosen)]
    return "\n".join(lines + [f"  {note}" for note in notes or []])


def _inference_line(cfg: RunConfig, est: Estimate) -> str:
    """Whether `ftl eval`/`ftl chat` fit the trained model on one device, else on how many
    with `ftl eval --shard`."""
    inf, c = est.inference, est.cluster
    device = "the host" if gpu_preset(c["gpu"]).is_cpu else f"one {c['gpu']}"
    head = (f"inference (ftl eval, eval.batch_size={cfg.eval.batch_size} x "
            f"{cfg.dataset.max_length} tokens): {_size(inf.weight_bytes)} weights + "
            f"{_size(inf.batch_bytes)} KV cache and logits + {_size(inf.buffer_bytes)} "
            f"allowance = {_size(inf.total_bytes)}: ")
    if inf.fits:
        return head + f"fits {device}"
    if inf.shard_devices:
        return head + (f"not {device}; ftl eval --shard spreads it over {inf.shard_devices} "
                       f"of the node's {c['gpus_per_node']}")
    return head + (f"not {device}, nor the node's {c['gpus_per_node']} with --shard. Fix: a "
                   "smaller eval.batch_size or dataset.max_length, or more memory")


def _header(cfg: RunConfig, est: Estimate) -> list[str]:
    """Model, cluster, compute and the memory rules: what the rows below assume."""
    c = est.cluster
    host = (f"{c['host_memory_gib']:g} GiB host RAM/node" if c["host_memory_gib"]
            else "host RAM not checked (cluster.host_memory_gib=0)")
    buffers = est.strategies[0].buffer_bytes / GIB  # the same on every row
    trainable = ("all trainable" if est.trainable_params == est.params
                 else f"{_count(est.trainable_params)} trainable adapter params")
    return [
        f"{est.model}: {_count(est.params)} params ({trainable}{_active_text(cfg)}), "
        f"precision {est.precision}, {c['nodes']} node(s) x "
        f"{c['gpus_per_node']} {c['gpu']} ({c['gpu_memory_gib']:g} GiB), {host}"
        + _model_parallel_text(cfg),
        _compute_line(cfg, est),
        "memory per rank: peak = predicted peak of live tensor bytes (max over construction, "
        "step and checkpoint save; states = model states in the optimizer step); "
        f"total = peak + {buffers:g} GiB framework allowance; fits = total <= "
        f"{FIT_FRACTION:.0%} of device memory; micro batch " + _micro_batch_text(cfg)
        + (f" ({rank_sequence(cfg)} per rank)" if cfg.parallel.sp > 1 else "")
        + (", gradient checkpointing" if cfg.train.gradient_checkpointing else ""),
    ] + [line for line in (lora_coverage(cfg),) if line]


def _active_text(cfg: RunConfig) -> str:
    """An MoE model: the parameters compute counts, beside the total memory counts."""
    m = cfg.model
    if not is_moe(m):
        return ""
    return (f"; {_count(active_params(m))} active per token: {m.experts_per_token} of "
            f"{m.num_experts} experts, compute counts those, memory all")


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 1024**2:.1f} MiB"


def _reference_lines(est: Estimate) -> list[str]:
    """objective=dpo: where the frozen reference lives, one line per placement naming its
    rows (one line when every row has the same)."""
    placements: dict[str, list[str]] = {}
    for row in est.strategies:
        placements.setdefault(row.reference, []).append(row.strategy)
    head = "  ref: DPO's frozen reference model (TRL), in states"
    if len(placements) == 1:
        return [f"{head}: {next(iter(placements))}"]
    return [f"{head}:", *(f"    {', '.join(names)}: {where}"
                          for where, names in placements.items())]


def _model_parallel_text(cfg: RunConfig) -> str:
    tp, sp = cfg.parallel.tp, cfg.parallel.sp
    if tp > 1:
        return f"; parallel.tp={tp}: each linear split over {tp} ranks, {cfg.dp_size} data-parallel"
    if sp > 1:
        return (f"; parallel.sp={sp}: each sequence split over {sp} ranks (Ulysses all-to-all "
                f"in every attention), {cfg.dp_size} data-parallel")
    return ""


def _micro_batch_text(cfg: RunConfig) -> str:
    b, s = cfg.train.micro_batch_size, cfg.dataset.max_length
    if is_dpo(cfg):
        return f"{b} pair(s) = {micro_sequences(cfg)} x {s} tokens (chosen + rejected)"
    return f"{b} x {s} tokens"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _compute_line(cfg: RunConfig, est: Estimate) -> str:
    if est.tokens is None or est.flops is None:
        return ("compute: unknown - the token count is not known; set dataset.num_tokens "
                "(tokens per epoch) or train.max_steps")
    factor, grads = run_flops_factor(cfg), expert_gradient_params(cfg)
    # the adapted experts' and router's weight gradients (flops.expert_gradient_params)
    factor_text = f"{factor}PD + 2 x {_count(grads)} x D" if grads else f"{factor}PD"
    what = " of chosen + rejected sequences" if is_dpo(cfg) else ""
    ref = ", the reference forward included" if is_dpo(cfg) else ""
    return (f"compute: {est.tokens:.3g} tokens{what}, {est.flops:.3g} FLOPs ({factor_text}{ref}), "
            f"{_duration(est.est_seconds)} at MFU {cfg.train.mfu:g} = {est.gpu_hours:.3g} "
            "GPU-hours (same MFU for every row)")


def _chosen_line(cfg: RunConfig, chosen: str | None) -> str:
    if cfg.strategy.name != "auto":
        return f"* configured: strategy={chosen}"
    if chosen is None:
        return "strategy=auto: nothing fits (see `ftl plan` for the reasons and fixes)"
    return f"* strategy=auto picks {chosen} (the fastest that fits)"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.2g} s"
