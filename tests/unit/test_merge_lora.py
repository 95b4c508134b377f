"""launcher/engines/final_model.merge_lora_state_dict: W + scaling * B @ A, in place on a gathered
state dict (no second copy of the base), on copies of the live model's own."""

from __future__ import annotations

import torch

from launcher.engines.final_model import LORA_A, LORA_B, merge_lora_state_dict

PREFIX = "base_model.model.model.layers.0.self_attn.q_proj"


def peft_state_dict(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        f"{PREFIX}.base_layer.weight": torch.randn(8, 6, generator=generator).to(dtype),
        f"{PREFIX}{LORA_A}": torch.randn(2, 6, generator=generator),
        f"{PREFIX}{LORA_B}": torch.randn(8, 2, generator=generator),
        "base_model.model.lm_head.weight": torch.randn(5, 6, generator=generator).to(dtype),
    }


def expected(state: dict[str, torch.Tensor], scaling: float) -> torch.Tensor:
    weight = state[f"{PREFIX}.base_layer.weight"]
    delta = scaling * (state[f"{PREFIX}{LORA_B}"] @ state[f"{PREFIX}{LORA_A}"])
    return (weight.float() + delta).to(weight.dtype)


def test_a_gathered_state_dict_is_merged_in_place() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        state = peft_state_dict(dtype)
        want = expected(state, 2.0)
        base = state[f"{PREFIX}.base_layer.weight"]
        merged = merge_lora_state_dict(state, 2.0, copy=False)
        weight = merged["model.layers.0.self_attn.q_proj.weight"]
        assert weight.data_ptr() == base.data_ptr()  # the gathered tensor itself
        assert torch.equal(weight, want)
        assert torch.equal(merged["lm_head.weight"], state["base_model.model.lm_head.weight"])
        assert not any("lora" in name for name in merged)


def test_the_live_models_state_dict_is_left_untouched() -> None:
    state = peft_state_dict(torch.float32)
    before = state[f"{PREFIX}.base_layer.weight"].clone()
    want = expected(state, 0.5)
    merged = merge_lora_state_dict(state, 0.5)
    assert torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], want)
    assert torch.equal(state[f"{PREFIX}.base_layer.weight"], before)
