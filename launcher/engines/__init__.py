"""The distributed engines: `strategy.backend` names one, and every other module asks it.

ENGINES maps each backend to "module:Class" (imported on first use, so `ftl plan` of a
DDP run loads no DeepSpeed code). A site can use an engine of its own without changing
ftlaunch: `backend: my_package.my_module:MyEngine` in a strategy YAML (configs/strategy/,
or a site tree under FTL_CONFIG_DIR) names a subclass of launcher.engines.base.Engine,
importable on the launching machine and on every rank.
"""

from __future__ import annotations

import importlib
from functools import cache

from launcher.config.schema import StrategyConfig
from launcher.config.strategies import AUTO, is_auto
from launcher.engines.base import Engine

ENGINES: dict[str, str] = {
    "ddp": "launcher.engines.ddp:DdpEngine",
    "deepspeed": "launcher.engines.deepspeed:DeepSpeedEngine",
    "fsdp": "launcher.engines.fsdp:FsdpEngine",
}
AUTO_FAMILY = "deepspeed"
"""The sharding engine strategy=auto climbs unless strategy.backend names another."""


def engine_of(strategy: StrategyConfig) -> Engine:
    """The engine of a concrete strategy (validation has checked `backend_problems`)."""
    return _load(strategy.backend)


@cache
def _load(backend: str) -> Engine:
    module_name, class_name = ENGINES.get(backend, backend).split(":")
    engine_class = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(engine_class, type) and issubclass(engine_class, Engine)):
        raise TypeError(f"{backend} is not a launcher.engines.base.Engine subclass")
    return engine_class()


def backend_problems(strategy: StrategyConfig) -> list[str]:
    """strategy.backend names a registered engine, `auto`, or an importable Engine class."""
    backend = strategy.backend
    if backend in ENGINES or (backend == AUTO and is_auto(strategy)):
        return []
    known = "|".join([*ENGINES, AUTO])
    if backend == AUTO:  # a concrete strategy has no engine to run it
        return [f"strategy.backend=auto with strategy={strategy.name}: auto is not an engine, "
                f"only strategy=auto's default. Fix: strategy.backend={'|'.join(ENGINES)}, "
                "or strategy=auto."]
    if ":" not in backend:
        return [f"strategy.backend={backend}: not an engine. Fix: strategy.backend={known}, "
                "or module:Class of an Engine subclass (launcher/engines/base.py)."]
    try:
        _load(backend)
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        return [f"strategy.backend={backend}: cannot load the engine ({error}). Fix: a "
                f"module:Class importable here naming an Engine subclass, or {known}."]
    return []


def in_auto_ladder(strategy: StrategyConfig, family: str) -> bool:
    """strategy=auto may pick it: no sharding, or the sharding engine `family`
    (`auto`: AUTO_FAMILY)."""
    wanted = AUTO_FAMILY if family == AUTO else family
    return not engine_of(strategy).shards or strategy.backend == wanted
