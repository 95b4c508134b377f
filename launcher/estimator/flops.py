"""Parameters, tokens, FLOPs and time of a run: arithmetic on the RunConfig alone.

No torch, transformers or deepspeed import: `ftl estimate`, `ftl plan`, `ftl report` and
the worker's MFU callback share these figures without loading a model.

- Parameters: counted from the architecture numbers (Llama-style decoder: GQA attention,
  gated MLP, RMSNorm, q/k/v biases for architecture=qwen2, untied lm_head unless
  `model.tie_word_embeddings`). Equal to the published counts of Llama-2 7B/13B/70B and
  Mistral-7B, and to HF models built from the same numbers (tests).
- Compute: C = 6PD (Kaplan et al. 2020; flops_factor), attention's s^2 FLOPs left out
  as in the 6PD rule.
- Time = C / (world size x peak x `train.mfu`), the same MFU for every strategy: offload
  usually runs at a lower MFU, which we do not guess.
"""

from __future__ import annotations

from launcher.config.hardware import GpuPreset, gpu_preset
from launcher.config.schema import ModelConfig, RunConfig


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


def lora_targets(cfg: RunConfig) -> list[str]:
    """The decoder linears LoRA adapts: peft.target_modules ("all-linear": all seven)."""
    wanted = cfg.peft.target_modules
    return [t for t in linear_shapes(cfg.model) if "all-linear" in wanted or t in wanted]


def adapter_params(cfg: RunConfig) -> int:
    """LoRA adapter parameters: r*(in+out) per targeted linear per layer (measured: 1,048,576
    on the 102M Llama with q/k/v/o, r 16: the model's parameters grew by exactly that)."""
    if cfg.peft.name == "none":
        return 0
    shapes = linear_shapes(cfg.model)
    per_layer = sum(cfg.peft.r * sum(shapes[t]) for t in lora_targets(cfg))
    return cfg.model.num_layers * per_layer


def trainable_params(cfg: RunConfig) -> int:
    """What the optimizer updates: the adapters under LoRA/QLoRA, else every parameter."""
    return adapter_params(cfg) if cfg.peft.name != "none" else count_params(cfg.model)


def global_batch_size(cfg: RunConfig) -> int:
    train = cfg.train
    return train.global_batch_size or train.micro_batch_size * train.grad_accum * cfg.dp_size


def training_tokens(cfg: RunConfig) -> int | None:
    """Tokens D the run processes; None when neither max_steps nor num_tokens says."""
    if cfg.train.max_steps > 0:
        return cfg.train.max_steps * global_batch_size(cfg) * cfg.dataset.max_length
    if cfg.dataset.num_tokens:
        return int(cfg.dataset.num_tokens * cfg.train.epochs)
    return None


def flops_factor(gradient_checkpointing: bool = False, frozen_base: bool = False) -> int:
    """FLOPs per parameter per token: 6 (2 forward + 4 backward), 4 with a frozen base
    (no weight gradients), + 2 for the forward that gradient checkpointing repeats."""
    return (4 if frozen_base else 6) + (2 if gradient_checkpointing else 0)


def training_flops(
    params: int, tokens: int, gradient_checkpointing: bool = False, frozen_base: bool = False
) -> float:
    """C = flops_factor x PD (the adapters' own FLOPs are negligible)."""
    return float(flops_factor(gradient_checkpointing, frozen_base)) * params * tokens


def run_flops(cfg: RunConfig, tokens: int) -> float:
    """C for `tokens` tokens of this run, recomputation included (what the clock pays for)."""
    return training_flops(
        count_params(cfg.model), tokens, cfg.train.gradient_checkpointing, cfg.peft.name != "none"
    )


def flops_per_token(cfg: RunConfig) -> float:
    """Model FLOPs per trained token, the numerator of MFU.

    Gradient checkpointing is left OUT: MFU counts the FLOPs the model needs, not the
    recomputed forward (that would be hardware FLOPs utilisation), so a run that
    recomputes shows a lower MFU for the same tokens/s, as in the PaLM paper's definition.
    """
    return training_flops(count_params(cfg.model), 1, frozen_base=cfg.peft.name != "none")


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
