"""The shipped model presets counted (launcher/config/architecture.py) against the model
transformers 5.24 builds from the same numbers (on the meta device: no memory, no init)
and against the counts the model cards publish."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from launcher.config.architecture import active_params, count_params, largest_layer_params
from launcher.config.compose import compose_config
from launcher.config.schema import ModelConfig
from launcher.rank.model import model_config

PUBLISHED = {
    # preset: (total, active per token) as the model cards round them
    "llama-3.1-8b": (8.03e9, 8.03e9),
    "llama-3.1-70b": (70.6e9, 70.6e9),
    "qwen3-8b": (8.19e9, 8.19e9),
    "qwen3-32b": (32.8e9, 32.8e9),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "gemma-3-12b": (11.8e9, 11.8e9),  # the text decoder; the vision tower is not counted
}
PRESETS = [*PUBLISHED, "llama-7b", "mistral-7b", "qwen2.5-7b", "tiny-llama", "tiny-moe"]


def preset(name: str) -> ModelConfig:
    return compose_config([f"model={name}"]).model


class NoTokenizer:
    """What model_config reads of a tokenizer: the special ids and a length no larger
    than the vocabulary, so the preset's vocab_size stands."""
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __len__(self) -> int:
        return 0


def built_on_meta(name: str) -> Any:
    cfg = compose_config([f"model={name}", "model.path="])  # from the numbers, not the hub
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(model_config(cfg, NoTokenizer()))


@pytest.mark.parametrize("name", PRESETS)
def test_count_and_largest_module_equal_the_hf_model_built_from_the_preset(name: str) -> None:
    """DeepSpeed's model_to_params counting: every parameter once, the largest module
    by its own parameters (an MoE layer's experts module)."""
    model, numbers = built_on_meta(name), preset(name)
    assert model.config.model_type == numbers.architecture
    assert model.num_parameters() == count_params(numbers)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert largest == largest_layer_params(numbers)


@pytest.mark.parametrize(("name", "published"), PUBLISHED.items())
def test_totals_and_active_counts_match_the_model_cards(
        name: str, published: tuple[float, float]) -> None:
    """Within 1 %; the active count within the card's last digit (Qwen3-30B-A3B's card
    truncates 3.353B to 3.3B; its embedding and lm_head, 0.62B, are in it)."""
    total, active = published
    numbers = preset(name)
    assert count_params(numbers) == pytest.approx(total, rel=0.01)
    assert active_params(numbers) == pytest.approx(active, rel=0.01, abs=0.06e9)


def test_active_params_are_what_one_token_runs_through() -> None:
    """tiny-moe: all but experts_per_token experts of each layer idle for a token."""
    m = preset("tiny-moe")
    expert = 3 * m.hidden_size * m.intermediate_size
    idle = m.num_layers * (m.num_experts - m.experts_per_token) * expert
    assert active_params(m) == count_params(m) - idle
    assert active_params(preset("tiny-llama")) == count_params(preset("tiny-llama"))


def test_head_dim_sizes_attention_where_heads_times_it_is_not_hidden() -> None:
    """Qwen3-32B: 64 heads x 128 = 8192 query width over hidden 5120."""
    m = built_on_meta("qwen3-32b").model.layers[0].self_attn
    assert tuple(m.q_proj.weight.shape) == (64 * 128, 5120)
    assert tuple(m.k_proj.weight.shape) == (8 * 128, 5120)
