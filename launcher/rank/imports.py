"""A rank's imports as a start-up phase of their own (what the timing marks call "imports":
launcher/timing.py)."""

from __future__ import annotations

import importlib
import logging

from launcher import timing
from launcher.config.schema import RunConfig
from launcher.engines.base import Engine


def import_stack(cfg: RunConfig, engine: Engine) -> None:
    """Import the stack this run uses now, so the imports show as a phase of their own
    instead of inflating whichever step needs them first. transformers.trainer also imports
    every optional library that is installed (datasets, peft, and through peft bitsandbytes:
    docs/evidence/stack.md, "Import costs"); the ranks leave that to the libraries."""
    if cfg.peft.name != "qlora":
        # On CPUs with AVX512-BF16 bitsandbytes' import fetches a 4-bit CPU kernel from the
        # Hub (`kernels`) and warns when it cannot (offline, or `kernels` missing): a hint
        # for QLoRA, noise in every other run's log.
        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    import transformers.trainer  # noqa: F401

    for library in engine.libraries:
        importlib.import_module(library)
    timing.mark("imported")
