"""FlexAttention under mixed precision: transformers' flex_attention with its inputs cast to
the autocast dtype, as SDPA's are.

The model keeps fp32 master weights and trains under autocast, and the Llama/Qwen rotary
step hands the kernel fp32 queries and keys next to bf16 values (measured on CPU:
transformers 5.25, torch 2.13). SDPA is on autocast's cast list. FlexAttention is a
higher-order op whose autocast handling arrived late (pytorch #165468, PR #171160): on a
torch without it the mixed inputs fail its dtype check, or run fp32 kernels, several times
slower (reported on H100s: k2-fsa/OmniVoice #212). The GPU check's image has torch 2.11.
Casting here gives every torch the same bf16 (fp16) kernel.
"""

from __future__ import annotations

from typing import Any

import torch


def cast_flex_inputs() -> None:
    """Make model.attn_implementation=flex_attention cast query, key and value to the
    autocast dtype where autocast is on (this process, from now on)."""
    from transformers import AttentionInterface

    AttentionInterface.register("flex_attention", flex_attention_in_autocast_dtype)


def flex_attention_in_autocast_dtype(module: torch.nn.Module, query: torch.Tensor,
                                     key: torch.Tensor, value: torch.Tensor,
                                     *args: Any, **kwargs: Any) -> Any:
    # Looked up at each call (not bound at import): the kernel is transformers' own.
    from transformers.integrations import flex_attention

    device = query.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        query, key, value = (t.to(dtype) for t in (query, key, value))
    return flex_attention.flex_attention_forward(module, query, key, value, *args, **kwargs)
