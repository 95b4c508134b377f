"""A rank's imports as a start-up phase of their own, without the libraries its run never
uses (what the timing marks call "imports": launcher/timing.py)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from launcher import timing
from launcher.config.schema import RunConfig
from launcher.engines import ENGINE_LIBRARIES, engine_of


def import_stack(cfg: RunConfig, builds_data: bool = False) -> None:
    """Import what this run uses now, so the imports show as a phase of their own instead
    of inflating whichever step needs them first; and keep out what it never uses.

    The libraries import what is installed, not what a run uses, and offer no switch
    (transformers.trainer imports datasets and peft, peft imports bitsandbytes: ~0.5-5 s
    of CPU per rank each, docs/stack-notes.md, "Import costs"). So `unused_libraries` are
    marked absent in sys.modules (None: `import` raises ImportError, and the availability
    checks say no): only in a rank, and only while none of them is imported yet, so no
    library saw them available first."""
    hidden = unused_libraries(cfg, builds_data)
    if not any(name in sys.modules for name in (*HEAVY, *hidden)):
        for name in hidden:
            sys.modules.setdefault(name, None)  # type: ignore[assignment]
    import transformers.trainer  # noqa: F401

    for library in engine_of(cfg.strategy).libraries:
        importlib.import_module(library)
    timing.mark("imported")


HEAVY = ("transformers", "accelerate", "peft", "bitsandbytes", "deepspeed", "datasets")


def unused_libraries(cfg: RunConfig, builds_data: bool = False) -> tuple[str, ...]:
    """Installed libraries a run never touches: peft without PEFT, bitsandbytes without
    QLoRA (LoRA does not use it), both only on a model built from config or from a local
    plain (unquantized, non-adapter) checkpoint; an engine's own library (deepspeed) under
    the other engines; `datasets` in a rank that does not tokenize (it reads the finished
    data with pyarrow, preprocess.load_rows)."""
    hidden: list[str] = []
    plain = _plain_model(cfg.model.path)
    if cfg.peft.name == "none" and plain:
        hidden.append("peft")
    if cfg.peft.name != "qlora" and plain:
        hidden.append("bitsandbytes")
    hidden += [lib for lib in ENGINE_LIBRARIES if lib not in engine_of(cfg.strategy).libraries]
    if not builds_data:
        hidden.append("datasets")
    return tuple(hidden)


def _plain_model(path: str) -> bool:
    if not path:
        return True  # built from the architecture numbers
    directory = Path(path)
    if not (directory / "config.json").is_file() or (directory / "adapter_config.json").exists():
        return False  # a hub id (not inspected here) or an adapter: leave everything visible
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "quantization_config" not in config
