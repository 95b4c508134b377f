"""The strategy table: configs/strategy/*.yaml, the one list of strategies.

The estimator, `strategy=auto`, the ds_config generator and validation all read it, so a
new strategy is a new YAML file (plus code only when it needs a new backend). Each file is
merged into the typed StrategyConfig, exactly as Hydra does when it composes `strategy=`.
"""

from __future__ import annotations

from dataclasses import fields, replace
from functools import cache
from pathlib import Path

from omegaconf import OmegaConf

from launcher.config.compose import config_dir
from launcher.config.schema import StrategyConfig

AUTO = "auto"
"""strategy=auto: not a strategy of its own; it resolves to one of the table's
(launcher/estimator/auto.py)."""

# Fields strategy=auto sets from the chosen strategy's YAML; every other strategy.* value the
# user gave next to strategy=auto (overlap_comm, bucket_size, ...) is kept.
CHOSEN_FIELDS = (
    "name", "backend", "zero_stage", "offload_optimizer", "offload_param", "auto_rank",
)


def strategy_table() -> dict[str, StrategyConfig]:
    """name -> settings of every strategy in configs/strategy/ (auto included)."""
    return dict(_load(config_dir()))


@cache
def _load(root: Path) -> tuple[tuple[str, StrategyConfig], ...]:
    schema = OmegaConf.structured(StrategyConfig)
    table = [OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.load(path)))
             for path in sorted((root / "strategy").glob("*.yaml"))]
    return tuple((settings.name, settings) for settings in table)


def is_auto(strategy: StrategyConfig) -> bool:
    """strategy=auto, also as `strategy=auto strategy.backend=fsdp` (the name stays auto)."""
    return strategy.name == AUTO


def concrete_strategies() -> dict[str, StrategyConfig]:
    """Every strategy a run can use (not `auto`, which resolves to one of them)."""
    return {n: s for n, s in strategy_table().items() if not is_auto(s)}


def with_user_settings(entry: StrategyConfig, user: StrategyConfig) -> StrategyConfig:
    """A copy of the table's `entry` with every non-CHOSEN_FIELDS value the user set next
    to strategy=auto (`user`: cfg.strategy) that differs from the schema's default."""
    defaults = StrategyConfig(name="auto", backend="auto")
    given = {f.name: getattr(user, f.name) for f in fields(StrategyConfig)
             if f.name not in CHOSEN_FIELDS and getattr(user, f.name) != getattr(defaults, f.name)}
    return replace(entry, **given)  # a new object: the cached table is never mutated
