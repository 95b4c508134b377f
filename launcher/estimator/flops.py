"""Parameters, tokens, FLOPs and time of a run: arithmetic on the RunConfig alone.

No torch, transformers or deepspeed import: `ftl estimate`, `ftl plan`, `ftl report` and
the worker's MFU callback share these figures without loading a model.

- Parameters: launcher/config/architecture.py.
- Compute: C = 6PD (Kaplan et al. 2020; flops_factor), attention's s^2 FLOPs left out
  as in the 6PD rule. objective=dpo adds the frozen reference's forward, 2PD. P is the
  ACTIVE parameter count (architecture.active_params): a mixture of experts runs each
  token through model.experts_per_token of its experts, so compute (FLOPs, MFU's
  numerator, time) counts those; memory counts every parameter (memory.py).
- Tokens D: tokens of the sequences the model runs. Under objective=dpo a row (a pair) is
  two sequences, prompt + chosen and prompt + rejected (TRL's DataCollatorForPreference
  concatenates them into one batch of 2 x micro_batch_size), so a pair counts the prompt
  twice and D doubles against one sequence per row (sequences_per_row).
- Time = C / (world size x peak x `train.mfu`), the same MFU for every strategy: offload
  usually runs at a lower MFU, which we do not guess.
"""

from __future__ import annotations

from launcher.config.architecture import (
    active_params,
    adapts_experts,
    all_linear,
    count_params,
    expert_adapter_shapes,
    is_moe,
    linear_shapes,
    one_expert_params,
    router_params,
)
from launcher.config.hardware import GpuPreset, gpu_preset
from launcher.config.objectives import is_dpo, sequences_per_row
from launcher.config.schema import RunConfig


def lora_targets(cfg: RunConfig) -> list[str]:
    """The decoder nn.Linear layers LoRA adapts: peft.target_modules ("all-linear": every
    one, architecture.linear_shapes: seven in a dense layer; an MoE layer's four attention
    projections, its other nn.Linear names refused by validation)."""
    wanted = cfg.peft.target_modules
    return [t for t in linear_shapes(cfg.model) if all_linear(cfg) or t in wanted]


def adapter_params(cfg: RunConfig) -> int:
    """LoRA adapter parameters: r*(in+out) per targeted linear per layer (measured: 1,048,576
    on the 102M Llama with q/k/v/o, r 16: the model's parameters grew by exactly that), and
    rank*experts*(in+out) per adapted MoE parameter (architecture.expert_adapter_shapes;
    tests/unit/test_moe.py: what peft adds)."""
    if cfg.peft.name == "none":
        return 0
    shapes = linear_shapes(cfg.model)
    per_layer = sum(cfg.peft.r * sum(shapes[t]) for t in lora_targets(cfg))
    per_layer += sum(r * e * (i + o) for r, e, i, o in expert_adapter_shapes(cfg).values())
    return cfg.model.num_layers * per_layer


def lora_coverage(cfg: RunConfig) -> str:
    """What LoRA adapts in an MoE model, in one line (the estimate prints it); "" without
    LoRA or experts. transformers 5 holds a layer's experts as 3-D parameters and its
    router as no nn.Linear: named targets reach attention only; all-linear reaches the
    experts and the router as parameters too, without dropout (peft's ParamWrapper)."""
    m = cfg.model
    if cfg.peft.name == "none" or not is_moe(m):
        return ""
    adapted = f"{cfg.peft.name} on {m.architecture}: adapters on {', '.join(lora_targets(cfg))}"
    if adapts_experts(cfg):
        return (f"{adapted}, each of the {m.num_experts} experts' gate_up_proj and "
                "down_proj and the router (all-linear; no dropout)")
    return f"{adapted} only; the {m.num_experts} experts of each layer and its router stay frozen"


def expert_gradient_params(cfg: RunConfig) -> int:
    """Active parameters whose weight gradient a LoRA run still computes: with the experts
    adapted, peft runs each expert on W + scaling x B @ A and the backward forms that
    weight's whole gradient (for the experts a token reaches and the router), so these
    cost 6 FLOPs per token, not a frozen base's 4; 0 otherwise."""
    if not adapts_experts(cfg):
        return 0
    m = cfg.model
    return m.num_layers * (m.experts_per_token * one_expert_params(m) + router_params(m))


def trainable_params(cfg: RunConfig) -> int:
    """What the optimizer updates: the adapters under LoRA/QLoRA, else every parameter."""
    return adapter_params(cfg) if cfg.peft.name != "none" else count_params(cfg.model)


def global_batch_size(cfg: RunConfig) -> int:
    train = cfg.train
    return train.global_batch_size or train.micro_batch_size * train.grad_accum * cfg.dp_size


def training_tokens(cfg: RunConfig) -> int | None:
    """Tokens D the run processes; None when neither max_steps nor num_tokens says.
    objective=dpo: tokens of chosen + rejected sequences, the prompt counted in each (from
    max_steps: 2 x pairs x dataset.max_length; dataset.num_tokens is read as that count)."""
    if cfg.train.max_steps > 0:
        return (cfg.train.max_steps * global_batch_size(cfg) * sequences_per_row(cfg)
                * cfg.dataset.max_length)
    if cfg.dataset.num_tokens:
        return int(cfg.dataset.num_tokens * cfg.train.epochs)
    return None


def flops_factor(gradient_checkpointing: bool = False, frozen_base: bool = False,
                 reference: bool = False) -> int:
    """FLOPs per parameter per token: 6 (2 forward + 4 backward), 4 with a frozen base
    (no weight gradients), + 2 for the forward that gradient checkpointing repeats, + 2
    for DPO's reference forward (no_grad; under LoRA the base with adapters disabled)."""
    return (4 if frozen_base else 6) + (2 if gradient_checkpointing else 0) + (
        2 if reference else 0)


def run_flops_factor(cfg: RunConfig) -> int:
    """flops_factor of cfg's run as the clock pays it: recomputation and, under
    objective=dpo, the reference forward (also with precompute_ref_log_probs: the same
    forward, run before the first step; counted per trained token, so an over-count when
    epochs > 1, as TRL precomputes once)."""
    return flops_factor(cfg.train.gradient_checkpointing, cfg.peft.name != "none", is_dpo(cfg))


def training_flops(
    params: int, tokens: int, gradient_checkpointing: bool = False, frozen_base: bool = False,
    reference: bool = False,
) -> float:
    """C = flops_factor x PD (the adapters' own FLOPs are negligible)."""
    return float(flops_factor(gradient_checkpointing, frozen_base, reference)) * params * tokens


def run_flops(cfg: RunConfig, tokens: int) -> float:
    """C for `tokens` tokens of this run, recomputation included (what the clock pays for)."""
    per_token = run_flops_factor(cfg) * active_params(cfg.model) + 2 * expert_gradient_params(cfg)
    return float(per_token) * tokens


def flops_per_token(cfg: RunConfig) -> float:
    """Model FLOPs per trained token, the numerator of MFU (objective=dpo: per token of
    chosen + rejected sequences, the reference forward included, 8P for a full fine-tune;
    not with precompute_ref_log_probs, whose reference forward runs before the steps).

    Gradient checkpointing is left OUT: MFU counts the FLOPs the model needs, not the
    recomputed forward (that would be hardware FLOPs utilisation), so a run that
    recomputes shows a lower MFU for the same tokens/s, as in the PaLM paper's definition.
    """
    reference = is_dpo(cfg) and not cfg.objective.precompute_ref_log_probs
    return training_flops(active_params(cfg.model), 1, frozen_base=cfg.peft.name != "none",
                          reference=reference) + 2.0 * expert_gradient_params(cfg)


def peak_flops(preset: GpuPreset, precision: str) -> float:
    """Dense peak FLOP/s of one device at the run's precision."""
    tflops = preset.peak_tflops_fp32 if precision == "fp32" else preset.peak_tflops_16bit
    return tflops * 1e12


def peak_flops_per_device(cfg: RunConfig) -> float | None:
    """The run's device peak FLOP/s, or None on the cpu preset, where MFU means nothing."""
    preset = gpu_preset(cfg.cluster.gpu)
    return None if preset.is_cpu else peak_flops(preset, cfg.precision.name)


def run_seconds(cfg: RunConfig, flops: float) -> float:
    """Wall time of `flops` on cfg's devices at train.mfu (the cpu preset has a nominal peak,
    so plans on CPU still get a figure)."""
    peak = peak_flops(gpu_preset(cfg.cluster.gpu), cfg.precision.name)
    return flops / (cfg.world_size * peak * cfg.train.mfu)
