"""The model for one rank: from weights on disk or the hub, or built from the
architecture numbers; 4-bit NF4 for QLoRA; LoRA adapters. Validation has already checked
that the sources exist and that the combination is supported."""

from __future__ import annotations

import os
from typing import Any

import torch

from launcher.config.architecture import all_linear, head_dim, is_moe
from launcher.config.hardware import gpu_preset
from launcher.config.schema import ModelConfig, RunConfig
from launcher.engines.base import Engine
from launcher.engines.final_model import fused_pattern_warning_silenced
from launcher.engines.pretrained import NO_HUB_KERNELS
from launcher.rank.attention import cast_flex_inputs


def build_model(cfg: RunConfig, engine: Engine, tokenizer: Any, whole: bool = False) -> Any:
    """From cfg.model.path (local dir or hub id), else from the architecture numbers.
    Under FSDP every rank but 0 builds an unfilled model (unless `whole`: a DPO reference,
    which TRL shards without filling): accelerate fills each rank's
    shards from rank 0's weights at prepare (`cpu_ram_efficient_loading`,
    launcher/engines/fsdp/settings.py). Else every rank built (or read) the whole model on
    its host first, N copies per node (transformers 5.24's from_pretrained has no
    rank-0-only path for FSDP: docs/evidence/stack.md)."""
    from transformers import AutoModelForCausalLM, set_seed

    set_seed(cfg.train.seed)  # identical initial weights on every rank
    if cfg.model.attn_implementation == "flex_attention":
        cast_flex_inputs()
    if cfg.peft.name == "qlora":
        return load_quantized(cfg)
    if engine.fills_from_rank_0 and not whole and int(os.environ.get("RANK", "0")) != 0:
        return unfilled_model(cfg, tokenizer)
    attention = cfg.model.attn_implementation  # validation/speed.py checked what it needs
    if cfg.model.path:
        return AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=model_dtype(cfg),
                                                    attn_implementation=attention,
                                                    **router_logits_kwargs(cfg.model),
                                                    **NO_HUB_KERNELS)
    with torch.device(build_device(cfg, engine)):
        return AutoModelForCausalLM.from_config(model_config(cfg, tokenizer),
                                                dtype=model_dtype(cfg),
                                                attn_implementation=attention)


def unfilled_model(cfg: RunConfig, tokenizer: Any) -> Any:
    """The model's structure with uninitialised host parameters: built on meta (no weight
    read, no random init), then every parameter allocated with torch.empty and never
    written, so the kernel commits no pages to it. Not left on meta: accelerate maps the
    optimizer's parameters to the sharded ones by data_ptr(), which is 0 for every meta
    tensor (accelerate issue 3930). Buffers stay real: accelerate copies the non-persistent
    ones (rotary inverse frequencies) from this rank's own model."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(model_config(cfg, tokenizer),
                                                 dtype=model_dtype(cfg),
                                                 attn_implementation=cfg.model.attn_implementation)
    model.tie_weights()  # init_empty_weights re-registers each parameter: ties come apart
    allocated: dict[int, torch.nn.Parameter] = {}  # a tied weight stays one parameter
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) not in allocated:
                allocated[id(param)] = torch.nn.Parameter(
                    torch.empty_like(param, device="cpu"), requires_grad=param.requires_grad)
            module._parameters[name] = allocated[id(param)]
    return model


def model_config(cfg: RunConfig, tokenizer: Any) -> Any:
    """The architecture: the checkpoint's config.json, else cfg.model's numbers."""
    from transformers import AutoConfig

    m = cfg.model
    if m.path:
        return AutoConfig.from_pretrained(m.path, **router_logits_kwargs(m))
    numbers: dict[str, Any] = dict(
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        intermediate_size=m.intermediate_size,
        vocab_size=max(m.vocab_size, len(tokenizer)),
        max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_word_embeddings,
        rope_theta=m.rope_theta,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        head_dim=head_dim(m),
    )
    return AutoConfig.for_model(m.architecture, **{**numbers, **expert_kwargs(m)})


MOE_CONFIG_KEYS = {"qwen3_moe": ("num_experts", "moe_intermediate_size"),
                   "mixtral": ("num_local_experts", "intermediate_size")}
"""What each HF MoE config class calls the expert count and one expert's width."""


def expert_kwargs(m: ModelConfig) -> dict[str, Any]:
    """The experts of an MoE model in its HF config's names, and router_logits_kwargs;
    nothing for a dense model."""
    if not is_moe(m):
        return {}
    count, width = MOE_CONFIG_KEYS[m.architecture]
    return {count: m.num_experts, width: m.intermediate_size,
            "num_experts_per_tok": m.experts_per_token, **router_logits_kwargs(m)}


def router_logits_kwargs(m: ModelConfig) -> dict[str, Any]:
    """An MoE model returns its router logits, so its forward adds the load-balancing loss
    (router_aux_loss_coef x aux_loss, transformers' default coefficient) to the loss: the
    experts stay in use, as axolotl and LLaMA-Factory train MoE models. A config key, so
    it also reaches model/config.json; for a checkpoint (model.path) it overrides its own."""
    return {"output_router_logits": True} if is_moe(m) else {}


def build_device(cfg: RunConfig, engine: Engine) -> str:
    """Where a model built from config is initialised: on this rank's GPU when the engine
    moves the whole model there anyway (ddp, ZeRO-1/2). On an H200 machine the random init
    of a 1.1B model took 16 s on the CPU and 0.3 s on the GPU, with the same construction
    peak on the GPU (bench/results/gpu_ab.json). The CPU on the cpu preset, under ZeRO-3
    (zero.Init partitions the model while it is built), under FSDP (the whole model on each
    GPU before sharding raised its construction peak from 4.6 to 8.2 GiB there) and with
    offloaded parameters."""
    strategy = cfg.strategy
    if (gpu_preset(cfg.cluster.gpu).is_cpu or strategy.offload_param
            or engine.memory_stage(strategy) == 3):
        return "cpu"
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"


def model_dtype(cfg: RunConfig) -> torch.dtype:
    """fp32 master weights (AMP and DeepSpeed cast for compute), except a frozen LoRA base,
    which needs no master copy: it stays in bf16 when training in bf16."""
    if cfg.peft.name == "lora" and cfg.precision.name == "bf16":
        return torch.bfloat16
    return torch.float32


def load_quantized(cfg: RunConfig) -> Any:
    """QLoRA base: 4-bit NF4 weights (bitsandbytes) read from model.path."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    # The layers' input dtype under the precision's autocast: bitsandbytes computes in
    # bnb_4bit_compute_dtype and casts each input to it (fp32 under fp16 AMP: slow, and a
    # warning per layer).
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision.name,
                                                                  torch.float32)
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
    )
    device = "cpu" if gpu_preset(cfg.cluster.gpu).is_cpu else int(os.environ.get("LOCAL_RANK", 0))
    return AutoModelForCausalLM.from_pretrained(
        cfg.model.path, quantization_config=quant, device_map={"": device},
        attn_implementation=cfg.model.attn_implementation, **NO_HUB_KERNELS,
    )


def peft_targets(cfg: RunConfig) -> str | list[str]:
    """peft.target_modules as peft takes them: all-linear only as the string (peft 0.21
    reads a list's "all-linear" as a module name and finds none); on an MoE model peft
    then maps it onto the experts and the router too (estimator/flops.py says what)."""
    return "all-linear" if all_linear(cfg) else list(cfg.peft.target_modules)


def apply_peft(model: Any, cfg: RunConfig) -> Any:
    if cfg.peft.name == "none":
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.peft.name == "qlora":
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=cfg.train.gradient_checkpointing
        )
    lora = LoraConfig(
        r=cfg.peft.r,
        lora_alpha=cfg.peft.alpha,
        lora_dropout=cfg.peft.dropout,
        target_modules=peft_targets(cfg),
        task_type="CAUSAL_LM",
    )
    with fused_pattern_warning_silenced():
        return get_peft_model(model, lora)
