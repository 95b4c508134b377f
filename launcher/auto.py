"""`strategy=auto`: pick the fastest strategy whose estimate fits, and say why.

Order (fastest first): ddp, zero1, zero2, zero3, zero2_offload, zero3_offload. Less
sharding means less communication, and offload (PCIe traffic, CPU Adam) is slowest, so
zero3 comes before zero2_offload. FSDP is never picked on its own: the user asks for it
with `strategy=auto strategy.backend=fsdp`, and the ladder becomes ddp, fsdp, fsdp_offload.

Figures come from launcher.estimate (default accounting). Pure: no torch import.
"""

from __future__ import annotations

import copy
from dataclasses import fields

from omegaconf import OmegaConf

from launcher.errors import ConfigError
from launcher.estimate import (
    DEFAULT_ACCOUNTING,
    FIT_FRACTION,
    GIB,
    StrategyEstimate,
    estimate,
)
from launcher.schema import RunConfig, StrategyConfig

DEEPSPEED_ORDER: tuple[str, ...] = (
    "ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload",
)
FSDP_ORDER: tuple[str, ...] = ("ddp", "fsdp", "fsdp_offload")

# Fields auto sets from the chosen strategy's YAML; every other strategy.* value the user
# gave next to strategy=auto (overlap_comm, bucket_size, ...) is kept.
CHOSEN_FIELDS = ("name", "backend", "zero_stage", "offload_optimizer", "offload_param")


def candidate_order(cfg: RunConfig) -> tuple[str, ...]:
    return FSDP_ORDER if cfg.strategy.backend == "fsdp" else DEEPSPEED_ORDER


def rejection(cfg: RunConfig, row: StrategyEstimate) -> str:
    """Why `row` does not fit, in numbers the user can act on."""
    gpu = cfg.cluster.gpu
    why = []
    if not row.fits_gpu:
        why.append(
            f"{row.gpu_bytes / GIB:.1f} GiB per GPU, {gpu} has "
            f"{row.gpu_capacity_bytes / GIB:g} ({FIT_FRACTION:.0%} usable: "
            f"{FIT_FRACTION * row.gpu_capacity_bytes / GIB:.1f})"
        )
    if not row.fits_host:
        why.append(
            f"{row.host_bytes / GIB:.1f} GiB host RAM per node, "
            f"cluster.host_memory_gib is {cfg.cluster.host_memory_gib:g}"
        )
    return f"{row.strategy} needs " + " and ".join(why)


def fastest_fitting(
    cfg: RunConfig, rows: list[StrategyEstimate]
) -> tuple[str | None, list[str]]:
    """(first candidate that fits or None, one reason line per candidate looked at)."""
    by_name = {row.strategy: row for row in rows}
    reasons: list[str] = []
    for name in candidate_order(cfg):
        row = by_name[name]
        if row.fits:
            reasons.append(
                f"{name} fits: {row.gpu_bytes / GIB:.1f} GiB per GPU of "
                f"{row.gpu_capacity_bytes / GIB:g} on {cfg.cluster.gpu}"
            )
            return name, reasons
        reasons.append(rejection(cfg, row))
    return None, reasons


def choose_strategy(
    cfg: RunConfig, accounting: str = DEFAULT_ACCOUNTING, tokens: int | None = None
) -> tuple[str, list[str]]:
    """The fastest strategy that fits cfg's model on cfg's cluster, and why.

    Raises ConfigError when none fits, with what would make one fit.
    """
    name, reasons = fastest_fitting(cfg, estimate(cfg, accounting, tokens).strategies)
    if name is None:
        raise ConfigError(nothing_fits(cfg, reasons, accounting))
    return name, reasons


def nothing_fits(cfg: RunConfig, reasons: list[str], accounting: str) -> list[str]:
    """One problem per rejected strategy, then the fixes, each tried on a copy of cfg."""
    problems = [f"strategy=auto: nothing fits on {_cluster_text(cfg)}:"]
    problems += [f"strategy=auto: {reason}" for reason in reasons]
    fixes = []
    if cfg.peft.name == "none":
        fixes.append(_tried(cfg, accounting, {"peft.name": "lora", "peft.bits": 16}))
        fixes.append(_tried(cfg, accounting, {"peft.name": "qlora", "peft.bits": 4}))
    fixes.append(_tried(cfg, accounting, {"cluster.nodes": cfg.cluster.nodes * 2}))
    fixes.append(_tried(cfg, accounting, {"dataset.max_length": cfg.dataset.max_length // 2}))
    if not cfg.train.gradient_checkpointing:
        fixes.append(_tried(cfg, accounting, {"train.gradient_checkpointing": True}))
    if cfg.train.micro_batch_size > 1:
        fixes.append(_tried(cfg, accounting, {"train.micro_batch_size": 1})
                     + " (raise train.grad_accum instead)")
    problems.append(
        "strategy=auto: Fix: " + "; ".join(fixes) + ". Fixes marked 'not enough alone' "
        "need to be combined."
    )
    return problems


def _tried(cfg: RunConfig, accounting: str, change: dict[str, object]) -> str:
    """The change as overrides, plus what auto would pick after it, or 'not enough alone'."""
    trial = copy.deepcopy(cfg)
    for path, value in change.items():
        section, key = path.split(".")
        setattr(getattr(trial, section), key, value)
    fit, _ = fastest_fitting(trial, estimate(trial, accounting).strategies)
    text = " ".join(f"{path.removesuffix('.name')}={_yaml(value)}" for path, value in change.items()
                    if path != "peft.bits")
    return f"{text} (fits with {fit})" if fit else f"{text} (not enough alone)"


def _yaml(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _cluster_text(cfg: RunConfig) -> str:
    return f"{cfg.cluster.nodes}x{cfg.cluster.gpus_per_node} {cfg.cluster.gpu}"


def strategy_settings(name: str) -> StrategyConfig:
    """configs/strategy/<name>.yaml as a StrategyConfig (read directly: no Hydra compose)."""
    from launcher.compose import config_dir

    node = OmegaConf.load(config_dir() / "strategy" / f"{name}.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(StrategyConfig), node)
    settings = OmegaConf.to_object(merged)
    assert isinstance(settings, StrategyConfig)
    return settings


def resolve_auto(
    cfg: RunConfig, accounting: str = DEFAULT_ACCOUNTING, tokens: int | None = None
) -> RunConfig:
    """A copy of cfg with strategy=auto replaced by the chosen strategy's settings.

    Other configs come back as an unchanged copy. Call choose_strategy for the reasons.
    """
    resolved = copy.deepcopy(cfg)
    if cfg.strategy.name != "auto":
        return resolved
    name, _ = choose_strategy(cfg, accounting, tokens)
    chosen = strategy_settings(name)
    defaults = StrategyConfig(name="auto", backend="auto")
    for f in fields(StrategyConfig):
        user_value = getattr(cfg.strategy, f.name)
        if f.name not in CHOSEN_FIELDS and user_value != getattr(defaults, f.name):
            setattr(chosen, f.name, user_value)
    resolved.strategy = chosen
    return resolved
