"""Parameters counted from a ModelConfig's architecture numbers (Llama-style decoder: GQA
attention, gated MLP, RMSNorm, q/k/v biases for architecture=qwen2, untied lm_head unless
`model.tie_word_embeddings`). Equal to the published counts of Llama-2 7B/13B/70B and
Mistral-7B, and to HF models built from the same numbers (tests).

Below the estimator and the engines: both size things by them (DeepSpeed's buckets,
the memory formulas).
"""

from __future__ import annotations

from launcher.config.schema import ModelConfig


def linear_shapes(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every linear layer in one decoder layer, by HF module name."""
    h, inter = model.hidden_size, model.intermediate_size
    kv = h // model.num_heads * model.num_kv_heads
    return {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }


def layer_linear_params(model: ModelConfig) -> int:
    """Weights of one decoder layer's linear layers (the ones QLoRA quantizes)."""
    return sum(i * o for i, o in linear_shapes(model).values())


def count_params(model: ModelConfig) -> int:
    """Total parameters of a Llama-style decoder from its architecture numbers."""
    h = model.hidden_size
    kv = h // model.num_heads * model.num_kv_heads
    bias = h + 2 * kv if model.architecture == "qwen2" else 0  # Qwen2 has q/k/v biases
    per_layer = layer_linear_params(model) + bias + 2 * h  # + input/post-attention norms
    embeddings = model.vocab_size * h
    lm_head = 0 if model.tie_word_embeddings else model.vocab_size * h
    return embeddings + model.num_layers * per_layer + h + lm_head  # + final norm


def rank_params(model: ModelConfig, tp: int = 1) -> int:
    """Parameters one tensor-parallel rank holds: every decoder linear split tp ways,
    embeddings, lm_head and norms whole (AutoTP)."""
    return count_params(model) - model.num_layers * layer_linear_params(model) * (tp - 1) // tp


def largest_layer_params(model: ModelConfig) -> int:
    """Parameters of the largest single module (what DeepSpeed's model_to_params finds):
    ZeRO-3 gathers one module at a time, so this sizes its working set."""
    biased = ("q_proj", "k_proj", "v_proj") if model.architecture == "qwen2" else ()
    linear = max(i * o + (o if name in biased else 0)
                 for name, (i, o) in linear_shapes(model).items())
    return max(model.vocab_size * model.hidden_size, linear)
