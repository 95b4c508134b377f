"""ZeRO-3 leaf modules for mixtures of experts. ZeRO-3 gathers each module's parameters
when its forward starts, in the order it recorded on the first step, and prefetches by
that order; an MoE block runs a different subset of its experts on every batch, so the
recorded order breaks and the run aborts (or hangs) unless the whole block is one "leaf"
that gathers all its experts at once (deepspeed.utils.set_z3_leaf_modules).

DeepSpeed 0.19.8 marks transformers' own blocks itself (MixtralSparseMoeBlock,
Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock: its DEFAULT_LEAF_MODULE_CLASSES, applied
when the engine starts), and transformers 5 keeps their experts in one module of 3-D
weights anyway. Remote-code models (DeepSeek, older Qwen-MoE ports) hold an nn.ModuleList
of expert MLPs inside a block: those blocks are found here by that structure, whatever
their class is called, and marked before deepspeed.initialize.
"""

from __future__ import annotations

from typing import Any


def expert_list_blocks(model: Any) -> list[type]:
    """Classes of the modules that hold an nn.ModuleList named `experts` and are not yet
    leaf modules, in the order first met."""
    from torch import nn

    found: dict[str, type] = {}
    for module in model.modules():
        if isinstance(getattr(module, "experts", None), nn.ModuleList) and not getattr(
                module, "_z3_leaf", False):
            found.setdefault(type(module).__qualname__, type(module))
    return list(found.values())


def mark_expert_blocks(model: Any) -> list[str]:
    """Mark every expert-list block of `model` as a ZeRO-3 leaf module; the names of the
    classes marked (empty: nothing to do)."""
    classes = expert_list_blocks(model)
    if classes:
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, classes)
    return [cls.__qualname__ for cls in classes]
