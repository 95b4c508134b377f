"""An MoE model's experts on a resume through the Trainer's own weights file.

transformers 5.24 saves a checkpoint with save_pretrained, which writes an MoE layer's
fused experts back in the per-expert layout of the hub checkpoints (experts.N.gate_proj,
...; its revert_weight_conversion). The Trainer resumes that file with load_state_dict
(strict=False) and no conversion (transformers issue 43701): the experts come back as
missing keys, left as built, with a warning only. The run then trains its initial experts
with the trained optimizer state: on the tiny MoE under ddp the losses left the
uninterrupted run's at the first resumed step (rel 6e-4), and 100 steps later the logits
differed by 0.6. DeepSpeed and FSDP resume their own files, keyed as the module is.

Here the model gets the checkpoint's weights through from_pretrained, which converts them,
before the Trainer's load, which then rewrites the other keys with the same values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.engines.pretrained import NO_HUB_KERNELS

WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json")
"""What save_pretrained writes (one file, or shards with an index)."""


def restore_experts(model: Any, checkpoint: Path) -> bool:
    """Load `checkpoint`'s weights, converted, into `model` (strictly: every key); False
    when the checkpoint holds no save_pretrained weights (an adapter-only checkpoint)."""
    if not any((checkpoint / name).is_file() for name in WEIGHTS_FILES):
        return False
    from transformers import AutoModelForCausalLM

    dtype = next(model.parameters()).dtype
    saved = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, **NO_HUB_KERNELS)
    model.load_state_dict(saved.state_dict())
    return True
