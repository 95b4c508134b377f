"""Rules for the architecture numbers beyond the plain decoder: the head width, a mixture
of experts, and what ftl runs on an MoE model (LoRA's targets, the model-parallel axes).
Config rules: none depends on the strategy."""

from __future__ import annotations

from launcher.config.architecture import (
    DENSE_ARCHITECTURES,
    MOE_ARCHITECTURES,
    adapts_experts,
    all_linear,
    is_moe,
)
from launcher.config.schema import RunConfig
from launcher.errors import flagged

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The nn.Linear layers of an MoE decoder layer: LoRA's only named targets there."""


def architecture_problems(cfg: RunConfig) -> list[str]:
    return (_head_dim(cfg) + _experts(cfg) + _expert_widths(cfg) + _moe_parallel(cfg)
            + _moe_lora(cfg))


def _head_dim(cfg: RunConfig) -> list[str]:
    head_dim = cfg.model.head_dim
    return flagged([
        (head_dim < 0,
         f"model.head_dim={head_dim}: the width of one attention head. Fix: a positive "
         "model.head_dim, or 0 for model.hidden_size / model.num_heads."),
    ])


def _experts(cfg: RunConfig) -> list[str]:
    """Both 0 (dense), or num_experts >= 2 with 1 <= experts_per_token <= num_experts, on
    an architecture whose layers are experts."""
    m = cfg.model
    experts, per_token, arch = m.num_experts, m.experts_per_token, m.architecture
    dense_fix = "or model.num_experts=0 and model.experts_per_token=0 for a dense model"
    return flagged([
        (experts < 0 or experts == 1,
         f"model.num_experts={experts}: a mixture needs 2 or more experts. Fix: "
         f"model.num_experts=2 or more, {dense_fix}."),
        (experts >= 2 and not 1 <= per_token <= experts,
         f"model.experts_per_token={per_token} with model.num_experts={experts}: each token "
         f"goes to 1 to {experts} experts. Fix: model.experts_per_token between 1 and "
         f"{experts}."),
        (experts == 0 and per_token != 0,
         f"model.experts_per_token={per_token} with model.num_experts=0 (a dense model). "
         "Fix: model.experts_per_token=0, or set model.num_experts."),
        (experts == 0 and arch in MOE_ARCHITECTURES,
         f"model.architecture={arch} with model.num_experts=0: {arch}'s layers are "
         "mixtures of experts. Fix: set model.num_experts and model.experts_per_token "
         "(configs/model/qwen3-30b-a3b.yaml, mixtral-8x7b.yaml), or a dense architecture."),
        (experts > 0 and (arch in DENSE_ARCHITECTURES
                          or (not m.path and arch not in MOE_ARCHITECTURES)),
         f"model.num_experts={experts} with model.architecture={arch}: ftl builds experts "
         f"for {' and '.join(sorted(MOE_ARCHITECTURES))} only. Fix: model.architecture="
         f"{' or '.join(sorted(MOE_ARCHITECTURES))}, or model.num_experts=0."),
    ])


GROUPED_MM_ALIGNMENT = 8
"""transformers 5.24 runs an MoE layer's experts with torch's grouped_mm (its default
experts_implementation, CPU and GPU), whose rows must start 16 bytes apart: hidden and
expert widths in multiples of 8 elements at 16 bits (measured on CPU: width 86 fails in
fp32 with "strides should be multiple of 16 bytes")."""


def _expert_widths(cfg: RunConfig) -> list[str]:
    m, step = cfg.model, GROUPED_MM_ALIGNMENT
    if not is_moe(m):
        return []
    widths = {"model.hidden_size": m.hidden_size, "model.intermediate_size": m.intermediate_size}
    return [f"{key}={width} with model.num_experts={m.num_experts}: transformers' grouped "
            f"experts kernel needs rows 16 bytes apart, widths in multiples of {step}. Fix: "
            f"{key}={-(-width // step) * step} (or another multiple of {step})."
            for key, width in widths.items() if width % step]


def _moe_parallel(cfg: RunConfig) -> list[str]:
    if not is_moe(cfg.model):
        return []
    tp, sp, name = cfg.parallel.tp, cfg.parallel.sp, cfg.model.name
    return flagged([
        (tp > 1,
         f"parallel.tp={tp} with model={name} (a mixture of experts): how AutoTP splits "
         "the experts' fused 3-D weights is not measured here. Fix: parallel.tp=1 "
         "(strategy=zero3 or fsdp shard the experts instead)."),
        (sp > 1,
         f"parallel.sp={sp} with model={name} (a mixture of experts): each rank would "
         "balance the router over its slice of every sequence only (the load-balancing "
         "loss is not one rank's; not measured here). Fix: parallel.sp=1."),
    ])


def _moe_lora(cfg: RunConfig) -> list[str]:
    """LoRA on transformers 5's MoE layers: named targets reach the attention's nn.Linear
    only; all-linear also adapts the experts' 3-D weights and the router as parameters
    (peft 0.21's ParamWrapper), which refuses dropout (a preset's dropout turns off:
    compose.expert_lora_dropout_off; a typed one is refused here)."""
    peft, m = cfg.peft, cfg.model
    if peft.name == "none" or not is_moe(m):
        return []
    targets = list(peft.target_modules)
    others = [t for t in targets if t not in ATTENTION_TARGETS]
    attention = f"peft.target_modules=[{','.join(ATTENTION_TARGETS)}]"
    return flagged([
        (adapts_experts(cfg) and peft.dropout > 0,
         f"peft.dropout={peft.dropout:g} with peft.target_modules=[all-linear] on model="
         f"{m.name} (a mixture of experts): peft adapts the experts' 3-D weights and the "
         "router as parameters, which take no dropout. Fix: peft.dropout=0, or "
         f"{attention} to keep dropout (the experts and the router then stay frozen)."),
        (others and not all_linear(cfg),
         f"peft.target_modules=[{','.join(targets)}] with model={m.name} (a mixture of "
         f"experts): {', '.join(others)}: no nn.Linear of that name there (its MLP is "
         f"experts held as 3-D weights, and a router). Fix: {attention}, or a subset; "
         "peft.target_modules=[all-linear] adapts the experts and the router too."),
    ])
