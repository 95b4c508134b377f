"""Parameters counted from a ModelConfig's architecture numbers, as transformers 5.24 builds
each `model.architecture` (HF model_type):

- every one: GQA attention (q/k/v/o over heads of `head_dim`), RMSNorms, the embedding,
  a final norm and an lm_head unless `model.tie_word_embeddings`;
- llama, mistral: a gated MLP (gate/up/down_proj), 2 norms per layer;
- qwen2: + q/k/v biases; qwen3: + q_norm and k_norm (head_dim each) per layer, no biases;
- gemma3_text: qwen3's attention norms and 4 norms per layer (around attention and MLP);
- qwen3_moe (qwen3's attention), mixtral (mistral's): every layer's MLP is a mixture of
  `num_experts` gated MLPs of width `intermediate_size` and a router (h x E, no bias).
  transformers 5 keeps a layer's experts in ONE module of two 3-D weights, gate_up_proj
  (E x 2i x h) and down_proj (E x h x i), not a list of nn.Linear.

Equal to the published counts (Llama-2 7B/13B/70B, Mistral-7B, Llama-3.1, Qwen3,
Mixtral, Gemma 3's text decoder) and to the HF models built from the same numbers
(tests/unit/test_architecture.py). An unknown model_type is counted as llama.

Below the estimator and the engines: both size things by them (DeepSpeed's buckets,
the memory formulas).
"""

from __future__ import annotations

from launcher.config.schema import ModelConfig, RunConfig

QKV_BIAS = frozenset({"qwen2"})
"""Architectures whose q/k/v projections have biases."""
QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3_text"})
"""Architectures with an RMSNorm of head_dim on each query and key head."""
NORMS_PER_LAYER = {"gemma3_text": 4}
"""Norms of the residual stream per decoder layer; 2 (before attention, before the MLP)
for the others."""
MOE_ARCHITECTURES = frozenset({"qwen3_moe", "mixtral"})
"""Architectures whose layers are mixtures of experts (they need model.num_experts)."""
DENSE_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma3_text"})
"""Architectures with one MLP per layer (model.num_experts=0)."""


def head_dim(model: ModelConfig) -> int:
    """model.head_dim, or hidden_size / num_heads when 0."""
    return model.head_dim or model.hidden_size // max(model.num_heads, 1)


def query_width(model: ModelConfig) -> int:
    """Width of the queries (and of attention's output): num_heads x head_dim."""
    return model.num_heads * head_dim(model)


def kv_width(model: ModelConfig) -> int:
    """Width of the keys and of the values: num_kv_heads x head_dim."""
    return model.num_kv_heads * head_dim(model)


def is_moe(model: ModelConfig) -> bool:
    """A mixture of experts: num_experts > 0 (validation ties it to the architecture)."""
    return model.num_experts > 0


def linear_shapes(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every nn.Linear in one decoder layer, by HF module name: attention's
    four, and a dense model's MLP (an MoE layer's experts are 3-D parameters and its router
    is no nn.Linear: neither is here)."""
    h, inter = model.hidden_size, model.intermediate_size
    q, kv = query_width(model), kv_width(model)
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    if not is_moe(model):
        shapes.update(gate_proj=(h, inter), up_proj=(h, inter), down_proj=(inter, h))
    return shapes


def layer_linear_params(model: ModelConfig) -> int:
    """Weights of one decoder layer's nn.Linear layers (the ones QLoRA quantizes and
    AutoTP splits)."""
    return sum(i * o for i, o in linear_shapes(model).values())


def one_expert_params(model: ModelConfig) -> int:
    """One expert's gated MLP: gate_up 2ih + down ih."""
    return 3 * model.hidden_size * model.intermediate_size


def expert_params(model: ModelConfig) -> int:
    """One layer's experts module: E experts; 0 for a dense model."""
    return model.num_experts * one_expert_params(model)


def router_params(model: ModelConfig) -> int:
    """One layer's router (gate): h x E, no bias."""
    return model.hidden_size * model.num_experts


def all_linear(cfg: RunConfig) -> bool:
    """peft.target_modules names all-linear (the worker passes peft the string)."""
    return "all-linear" in cfg.peft.target_modules


def adapts_experts(cfg: RunConfig) -> bool:
    """LoRA with all-linear on an MoE model: peft adapts the experts' 3-D weights and the
    router as parameters too (expert_adapter_shapes), which take no dropout."""
    return cfg.peft.name != "none" and is_moe(cfg.model) and all_linear(cfg)


FUSED_RANK = {"gate_up_proj": 2}
"""Rank multiples peft 0.21 gives adapted expert weights: gate and up fused in one weight
get rank 2r (its rank_pattern, alpha doubled too), r for each half."""


def expert_adapter_shapes(cfg: RunConfig) -> dict[str, tuple[int, int, int, int]]:
    """(rank, experts, in, out) of each parameter of one MoE layer that peft's all-linear
    adapts as a parameter, not as an nn.Linear (its ParamWrapper, named as peft's
    target_parameters): the experts' gate_up_proj and down_proj, the router's weight; each
    expert gets its own rank-`rank` pair. {} unless adapts_experts."""
    if not adapts_experts(cfg):
        return {}
    m, r = cfg.model, cfg.peft.r
    h, i, e = m.hidden_size, m.intermediate_size, m.num_experts
    shapes = {"gate_up_proj": (e, h, 2 * i), "down_proj": (e, i, h), "gate.weight": (1, h, e)}
    return {name: (r * FUSED_RANK.get(name, 1), *shape) for name, shape in shapes.items()}


def layer_params(model: ModelConfig) -> int:
    """Every parameter of one decoder layer: linears, biases, norms, experts and router."""
    h, arch = model.hidden_size, model.architecture
    bias = query_width(model) + 2 * kv_width(model) if arch in QKV_BIAS else 0
    qk_norms = 2 * head_dim(model) if arch in QK_NORM else 0
    norms = NORMS_PER_LAYER.get(arch, 2) * h
    experts = expert_params(model) + router_params(model) if is_moe(model) else 0
    return layer_linear_params(model) + bias + qk_norms + norms + experts


def count_params(model: ModelConfig) -> int:
    """Total parameters: what memory holds (weights, gradients, optimizer states), every
    expert included."""
    h = model.hidden_size
    embeddings = model.vocab_size * h
    lm_head = 0 if model.tie_word_embeddings else model.vocab_size * h
    return embeddings + model.num_layers * layer_params(model) + h + lm_head  # + final norm


def active_params(model: ModelConfig) -> int:
    """Parameters one token runs through: count_params with experts_per_token experts per
    layer instead of all of them (the router still scores every expert). What compute
    counts (C = 6 x active x tokens); = count_params for a dense model."""
    idle = max(model.num_experts - model.experts_per_token, 0)
    return count_params(model) - model.num_layers * idle * one_expert_params(model)


def rank_params(model: ModelConfig, tp: int = 1) -> int:
    """Parameters one tensor-parallel rank holds: every decoder linear split tp ways,
    embeddings, lm_head and norms whole (AutoTP; validation keeps MoE models at tp 1)."""
    return count_params(model) - model.num_layers * layer_linear_params(model) * (tp - 1) // tp


def largest_layer_params(model: ModelConfig) -> int:
    """Parameters of the largest single module (what DeepSpeed's model_to_params finds):
    ZeRO-3 gathers one module at a time, so this sizes its working set. In an MoE model
    the experts module (E x 3 x h x i) is one module, usually the largest."""
    biased = ("q_proj", "k_proj", "v_proj") if model.architecture in QKV_BIAS else ()
    linear = max(i * o + (o if name in biased else 0)
                 for name, (i, o) in linear_shapes(model).items())
    return max(model.vocab_size * model.hidden_size, linear, expert_params(model))


def largest_tensor_params(model: ModelConfig, tp: int = 1) -> int:
    """Elements of the largest single parameter (one rank's share of a split linear): the
    embedding, a linear weight, or an MoE layer's gate_up_proj (E x 2i x h)."""
    linear = max(i * o for i, o in linear_shapes(model).values()) // tp
    gate_up = 2 * model.num_experts * model.intermediate_size * model.hidden_size
    return max(model.vocab_size * model.hidden_size, linear, gate_up)
