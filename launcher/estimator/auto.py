"""`strategy=auto`: pick the fastest strategy whose estimate fits, and say why.

The ladder is the strategy table's `auto_rank` order (docs/design.md, "The strategy
table"): less sharding means less communication, and offload (PCIe traffic, CPU Adam) is
slowest, so zero3 comes before zero2_offload. Activation checkpointing (about a third more
compute) comes before offload too: `pick` climbs the rungs that keep everything on the GPUs
as configured, then with train.gradient_checkpointing=true, then the offload rungs likewise
(the order of HF's DeepSpeed guide, which turns checkpointing on first). `choose` reads the
Estimate it is given; `pick` estimates once more for checkpointing, `nothing_fits` and
`model_parallel_layout` for their trial configs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from launcher.config.objectives import holds_reference
from launcher.config.schema import RunConfig
from launcher.config.strategies import (
    concrete_strategies,
    is_auto,
    strategy_table,
    with_user_settings,
)
from launcher.engines import in_auto_ladder
from launcher.engines.parallel_rules import engine_support_problems, model_parallel_problems
from launcher.estimator.estimate import Estimate, StrategyEstimate, estimate
from launcher.estimator.memory import FIT_FRACTION, GIB


def auto_ladder(sharding_backend: str) -> tuple[str, ...]:
    """strategy=auto's candidates, fastest first: the strategies that shard nothing plus
    those of one sharding engine (deepspeed by default; fsdp when asked with
    strategy.backend=fsdp)."""
    ranked = [
        s for s in concrete_strategies().values()
        if s.auto_rank >= 0 and in_auto_ladder(s, sharding_backend)
    ]
    return tuple(s.name for s in sorted(ranked, key=lambda s: (s.auto_rank, s.name)))


def candidates(cfg: RunConfig) -> tuple[str, ...]:
    """The ladder auto climbs for cfg, fastest first: the rungs whose engine supports the
    run (parallel.tp or parallel.sp > 1, a 4-bit base)."""
    ladder = auto_ladder(cfg.strategy.backend)
    return tuple(name for name in ladder if not engine_support_problems(resolve(cfg, name)))


def model_parallel_layout(cfg: RunConfig) -> tuple[RunConfig, Estimate, list[str]] | None:
    """When no strategy fits and the user set no model parallelism: the smallest group
    (2, 4, ... ranks) of sequence parallelism, then of tensor parallelism, under which one
    does, resolved, with its estimate and the reason line; None if none does. Ulysses
    divides the activations (what a long-sequence run runs out of) at one all-to-all per
    attention; AutoTP also divides the layers' states, at two all-reduces per layer."""
    if (cfg.parallel.tp, cfg.parallel.sp) != (1, 1):
        return None
    for size in range(2, cfg.world_size + 1):
        for axis in ("sp", "tp"):
            trial = copy.deepcopy(cfg)
            setattr(trial.parallel, axis, size)
            if cfg.world_size % size or model_parallel_problems(trial):
                continue
            est = estimate(trial)
            name, reasons = choose(trial, est)
            if name is not None:
                return resolve(trial, name), est, [f"{reasons[-1]} with parallel.{axis}={size}"]
    return None


def choose(cfg: RunConfig, est: Estimate,
           rungs: tuple[str, ...] | None = None) -> tuple[str | None, list[str]]:
    """(first candidate, or of `rungs`, whose row of `est` = estimate(cfg) fits, or None;
    one reason line per candidate looked at)."""
    reasons: list[str] = []
    for name in candidates(cfg) if rungs is None else rungs:
        row = est.row(name)
        if row is None:  # a ladder entry the estimate has no row for: cannot judge it
            reasons.append(f"{name}: no estimate (not in the strategy table)")
            continue
        if row.fits:
            reasons.append(
                f"{name} fits: {row.gpu_bytes / GIB:.1f} GiB per GPU of "
                f"{row.gpu_capacity_bytes / GIB:g} on {cfg.cluster.gpu}"
            )
            return name, reasons
        reasons.append(rejection(cfg, row))
    return None, reasons


def faster_elsewhere(cfg: RunConfig, est: Estimate, chosen: str,
                     checkpointed: bool = False) -> str | None:
    """A line for strategy=auto's pick when a rung of the sharding engine auto did not climb
    ranks above it and fits (say zero3_offload picked, fsdp fitting without offload); None
    otherwise. `checkpointed`: auto turned checkpointing on for `chosen`, and `est` is the
    run's without it, where a rung of the same rank that fits is faster too. The user's
    choice of engine stands: the line only says what to type."""
    table = concrete_strategies()
    climbed = set(candidates(cfg))
    for other in sorted(table.values(), key=lambda s: (s.auto_rank, s.name)):
        rank, top = other.auto_rank, table[chosen].auto_rank
        if not 0 <= rank <= top or (rank == top and not checkpointed) or other.name in climbed:
            continue
        row = est.row(other.name)
        if row is None or not row.fits or engine_support_problems(resolve(cfg, other.name)):
            continue
        size = f"{row.gpu_bytes / GIB:.1f} GiB per GPU"
        fits = (f"fits without checkpointing ({size}), faster than {chosen} with it"
                if checkpointed else f"also fits and is faster than {chosen} ({size})")
        return (f"{other.name} {fits}; auto climbs {table[chosen].backend}'s rungs unless "
                f"strategy.backend={other.backend}. To use it: strategy={other.name}")
    return None


def chosen_strategy(cfg: RunConfig, est: Estimate) -> str | None:
    """The configured strategy, or for `auto` what pick picks (None: nothing fits)."""
    if not is_auto(cfg.strategy):
        return cfg.strategy.name
    picked = pick(cfg, est)
    return picked.cfg.strategy.name if picked else None


CHECKPOINTING = "train.gradient_checkpointing=true"


@dataclass(frozen=True)
class Pick:
    """strategy=auto's choice."""

    cfg: RunConfig
    """The run resolved: the strategy named, checkpointing on where auto turned it on."""
    searched: RunConfig
    """The strategy=auto run it was picked on (faster_elsewhere reads it)."""
    estimate: Estimate
    """cfg's (the checkpointed run's where auto turned checkpointing on)."""
    reasons: list[str]
    """One line per rung looked at, the last the pick's."""
    checkpointed: bool = False
    """Whether auto turned train.gradient_checkpointing on to fit."""


def pick_notes(cfg: RunConfig, est: Estimate, picked: Pick) -> list[str]:
    """The lines after strategy=auto's pick (`est` = estimate(cfg)): checkpointing turned
    on, a faster rung of the other engine."""
    name = picked.cfg.strategy.name
    # checkpointed: a rung of the other engine that fits without it says more
    elsewhere = ((picked.checkpointed and faster_elsewhere(cfg, est, name, checkpointed=True))
                 or faster_elsewhere(picked.searched, picked.estimate, name))
    return [note for note in (checkpointing_note(cfg, est, picked), elsewhere) if note]


def offloads(name: str) -> bool:
    entry = strategy_table()[name]
    return entry.offload_optimizer or entry.offload_param


def pick(cfg: RunConfig, est: Estimate) -> Pick | None:
    """The fastest rung that fits (`est` = estimate(cfg)): the rungs that keep everything
    on the GPUs as configured, then, with checkpointing off and strategy.auto_checkpointing,
    with train.gradient_checkpointing=true; then the offload rungs in the same two ways.
    None: nothing fits (the reasons of the configured run: choose(cfg, est))."""
    ladder = candidates(cfg)
    trials = [(cfg, est, False)]
    if cfg.strategy.auto_checkpointing and not cfg.train.gradient_checkpointing:
        checkpointed = copy.deepcopy(cfg)
        checkpointed.train.gradient_checkpointing = True
        trials.append((checkpointed, estimate(checkpointed), True))
    reasons: list[str] = []
    for offloaded in (False, True):
        rungs = tuple(name for name in ladder if offloads(name) == offloaded)
        for trial, trial_est, turned_on in trials:
            name, looked = choose(trial, trial_est, rungs)
            reasons += [f"with {CHECKPOINTING}: {line}" if turned_on else line
                        for line in looked]
            if name is not None:
                return Pick(resolve(trial, name), trial, trial_est, reasons, turned_on)
    return None


def choice_line(resolved: RunConfig, checkpointed: bool) -> str:
    """strategy=auto's pick as `ftl train` and `ftl submit` print it: the strategy and what
    auto set with it; the reasons are in the plan."""
    settings = [f"parallel.{axis}={size}" for axis, size in
                (("sp", resolved.parallel.sp), ("tp", resolved.parallel.tp)) if size > 1]
    settings += [CHECKPOINTING] if checkpointed else []
    return (f"strategy=auto picked {resolved.strategy.name}"
            + (f" with {', '.join(settings)}" if settings else "")
            + " (why: `ftl plan` with the same overrides, or RUN_DIR/plan.json)")


def checkpointing_note(cfg: RunConfig, est: Estimate, picked: Pick) -> str | None:
    """The line for a pick that turned checkpointing on (`est` = estimate(cfg), the
    strategy=auto run without it); None otherwise."""
    if not picked.checkpointed:
        return None
    name = picked.cfg.strategy.name
    without, within = est.row(name), picked.estimate.row(name)
    assert without is not None and within is not None  # pick read both
    needs = (f"auto turns on {CHECKPOINTING}: {name} needs {within.gpu_bytes / GIB:.1f} GiB "
             f"per GPU with it, {without.gpu_bytes / GIB:.1f} without")
    offload = choose(cfg, est, tuple(n for n in candidates(cfg) if offloads(n)))[0]
    if offloads(name) or offload is None:
        return f"{needs}; nothing fits without it."
    return (f"{needs}; recomputing the activations costs about a third more compute, an "
            f"offloaded optimizer step usually far more. To keep it off: strategy={offload}.")


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


def nothing_fits(cfg: RunConfig, reasons: list[str]) -> list[str]:
    """One problem per rejected strategy, then the fixes, each tried on a copy of cfg (the
    caller raises ConfigError with them)."""
    cluster = cfg.cluster
    problems = [f"strategy=auto: nothing fits on {cluster.nodes}x{cluster.gpus_per_node} "
                f"{cluster.gpu}:"]
    problems += [f"strategy=auto: {reason}" for reason in reasons]
    fixes = []
    if holds_reference(cfg):  # the precompute holds no reference while training
        fixes.append(_tried(cfg, {"objective.precompute_ref_log_probs": True}))
    if cfg.peft.name == "none":
        fixes.append(_tried(cfg, {"peft.name": "lora", "peft.bits": 16}))
        fixes.append(_tried(cfg, {"peft.name": "qlora", "peft.bits": 4}))
    elif cfg.peft.name == "qlora":  # a 16-bit base shards under ZeRO-3 and FSDP
        fixes.append(_tried(cfg, {"peft.name": "lora", "peft.bits": 16}))
    fixes.append(_tried(cfg, {"cluster.nodes": cfg.cluster.nodes * 2}))
    fixes.append(_tried(cfg, {"dataset.max_length": cfg.dataset.max_length // 2}))
    if not cfg.train.gradient_checkpointing:
        fixes.append(_tried(cfg, {"train.gradient_checkpointing": True}))
    if cfg.train.micro_batch_size > 1:
        fixes.append(_tried(cfg, {"train.micro_batch_size": 1})
                     + " (raise train.grad_accum instead)")
    problems.append(
        "strategy=auto: Fix: " + "; ".join(fixes) + ". Fixes marked 'not enough alone' "
        "need to be combined."
    )
    return problems


def _tried(cfg: RunConfig, change: dict[str, object]) -> str:
    """The change as overrides, plus what auto would pick after it, or 'not enough alone'."""
    trial = copy.deepcopy(cfg)
    for path, value in change.items():
        section, key = path.split(".")
        setattr(getattr(trial, section), key, value)
    picked = pick(trial, estimate(trial))  # as auto would climb after the change
    text = " ".join(f"{path.removesuffix('.name')}={str(value).lower()}"  # YAML's true
                    for path, value in change.items() if path != "peft.bits")
    if picked is None:
        return f"{text} (not enough alone)"
    how = f" and {CHECKPOINTING}" if picked.checkpointed else ""
    return f"{text} (fits with {picked.cfg.strategy.name}{how})"


def resolve(cfg: RunConfig, name: str) -> RunConfig:
    """A copy of cfg with strategy=auto replaced by the table's `name` entry, keeping every
    other strategy.* value the user set next to it (CHOSEN_FIELDS come from the table); a
    named strategy comes back as an unchanged copy."""
    resolved = copy.deepcopy(cfg)
    if is_auto(cfg.strategy):
        resolved.strategy = with_user_settings(strategy_table()[name], cfg.strategy)
    return resolved
