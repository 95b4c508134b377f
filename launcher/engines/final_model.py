"""The pieces of the final model (RUN_DIR/model: a plain HF directory whatever the strategy)
that every engine shares: the merged LoRA model and the collective barrier. Each engine's
`save_final_model` (base.py and its overrides) decides how its weights are gathered.
Imported on the ranks only, when the run ends."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.engines.pretrained import NO_HUB_KERNELS


def save_merged_peft_model(
    trainer: Any, model_dir: Path, base_path: str,
    full_state_dict: Callable[[], dict[str, Any] | None], gathered: bool,
) -> Path:
    """model_dir/adapter (the PEFT adapter) and model_dir itself: the base model with the
    LoRA update merged in, loadable without peft. Works sharded: the full state dict is
    gathered (a collective), rank 0 merges it on CPU. QLoRA merges into the unquantized
    base weights read from `base_path` (the usual practice: 4-bit weights are lossy).
    `full_state_dict`: the whole weights on rank 0, a collective (None: the adapter only);
    `gathered`: they are fresh host tensors nobody else holds (ZeRO, FSDP), merged in place,
    where the plain model's own state dict shares the live weights and is copied."""
    trainer.save_model(str(model_dir / "adapter"))
    state_dict = full_state_dict()
    if trainer.is_world_process_zero() and state_dict is not None:
        from safetensors.torch import save_file

        peft_model = trainer.accelerator.unwrap_model(trainer.model)
        base_model = peft_model.get_base_model()
        lora = peft_model.peft_config["default"]
        scaling = lora.lora_alpha / (lora.r**0.5 if lora.use_rslora else lora.r)
        quantized = getattr(base_model, "is_loaded_in_4bit", False)
        base = unquantized_base(base_path) if quantized else None
        # the unquantized base is ours alone, like a gathered state dict: merged in place
        merged = merge_lora_state_dict(state_dict, scaling, base,
                                       copy=not (gathered or quantized),
                                       wrapped=wrapped_parameters(peft_model))
        save_file(merged, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
        config = base_model.config
        if quantized:
            config = type(config).from_pretrained(base_path)  # without quantization_config
        # a model built from config has none yet (save_pretrained of the model writes it),
        # and loaders (ftl chat, ftl eval, the harness) pick the class from it
        config.architectures = [type(base_model).__name__]
        config.save_pretrained(str(model_dir))
        trainer.processing_class.save_pretrained(str(model_dir))
    barrier()
    return model_dir


def unquantized_base(model_path: str) -> dict[str, Any]:
    """The base's weights by the names the model holds, read through transformers, which
    converts the layout a checkpoint was saved in: transformers 5 saves an MoE layer's
    fused experts per expert (experts.N.gate_proj, ...), names a raw read of the files
    would not find in the model (measured: QLoRA on the tiny MoE's experts failed on
    model.layers.0.mlp.experts.gate_up_proj). A hub id loads from its cache too."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto", **NO_HUB_KERNELS)
    state: dict[str, Any] = {}
    storages: set[int] = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in storages:  # a tied weight once, as save_pretrained does
            storages.add(tensor.data_ptr())
            state[name] = tensor
    return state


LORA_A, LORA_B = ".lora_A.default.weight", ".lora_B.default.weight"
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class WrappedParameter:
    """A parameter peft adapts in place of a module (its ParamWrapper: an MoE layer's 3-D
    experts weights, its router): which parameter, over how many experts, and whether
    the parameter is held (experts, out, in), as transformers 5's fused experts are, and
    its own scaling (peft gives the fused gate_up_proj rank and alpha 2x the config's)."""

    name: str
    experts: int
    out_first: bool
    scaling: float


def wrapped_parameters(peft_model: Any) -> dict[str, WrappedParameter]:
    """Each ParamWrapper's module name (a prefix of its lora_A/lora_B keys) -> what it
    adapts. Read from the modules' attributes, so it holds under ZeRO-3 (their tensors
    partitioned) as well."""
    return {
        name: WrappedParameter(module.parameter_name, module.num_experts,
                               module._did_swap_in_out_features, module.scaling["default"])
        for name, module in peft_model.named_modules()
        if type(module).__name__ == "ParamWrapper"
    }


def plain_name(key: str) -> str:
    """A peft key's name in the base model: no prefix, no (nested) base_layer."""
    return re.sub(r"\.base_layer(?=\.|$)", "", key.removeprefix(PEFT_PREFIX))


def merge_lora_state_dict(
    state_dict: dict[str, Any], scaling: float, base: dict[str, Any] | None = None,
    copy: bool = True, wrapped: dict[str, WrappedParameter] | None = None,
) -> dict[str, Any]:
    """PEFT LoRA state dict -> the base model's weights with W + scaling * B @ A.
    `base`: the base weights by their plain names; default: the (unquantized) base layers
    in `state_dict`. Each weight is merged in place; `copy=False` when the base tensors are
    host tensors no one else uses (a gathered state dict), so no second copy of the base is
    made first (rank 0 held the gathered base twice: ~13 GiB more for a 7B bf16 base).
    `wrapped` (wrapped_parameters): adapters of parameters rather than nn.Linear layers."""
    if base is None:
        base = {plain_name(key): value for key, value in state_dict.items()
                if ".lora_" not in key}
    merged: dict[str, Any] = {}
    for name, value in base.items():  # one at a time: a copied base is never held twice
        host = value.detach().cpu().contiguous()
        merged[name] = host.clone() if copy else host
    for key, a in state_dict.items():
        if not key.endswith(LORA_A):
            continue
        prefix = key.removesuffix(LORA_A)
        a, b = a.detach().cpu().float(), state_dict[prefix + LORA_B].detach().cpu().float()
        target = (wrapped or {}).get(prefix)
        if target is None:
            name, delta = plain_name(prefix) + ".weight", scaling * (b @ a)
        else:
            name = f"{plain_name(prefix)}.{target.name}"
            delta = target.scaling * expert_delta(a, b, target)
        weight = merged[name]
        weight.copy_((weight.float() + delta).to(weight.dtype))  # in place: no second base
    return merged


def expert_delta(a: Any, b: Any, target: WrappedParameter) -> Any:
    """B @ A of a ParamWrapper, per expert, in the parameter's layout: peft 0.21 holds
    lora_A as (experts x r, in) and lora_B as (out, r x experts) (its get_delta_weight;
    tests/unit/test_moe.py checks the merge against peft's own merge_and_unload)."""
    import torch

    if target.experts == 1:
        return b @ a
    a = a.reshape(target.experts, -1, a.shape[-1])  # experts, r, in
    b = b.reshape(b.shape[0], -1, target.experts)  # out, r, experts
    return torch.einsum("ore,eri->eoi" if target.out_first else "ore,eri->eio", b, a)


def has_weights(model_dir: Path) -> bool:
    return any(model_dir.glob("*.safetensors")) or any(model_dir.glob("pytorch_model*.bin"))


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


FUSED_PATTERN_WARNING = (r"The following (rank|alpha)_pattern keys did not match any targeted "
                         r"module and were ignored: \[[^\]]*gate_up_proj'\]")


@contextmanager
def fused_pattern_warning_silenced() -> Iterator[None]:
    """Around peft building or loading an adapter on an MoE's fused experts: peft 0.21 gives
    gate_up_proj rank and alpha 2x through rank_pattern and alpha_pattern, applies them to
    the parameter, then checks the keys against module names only and warns that they were
    ignored; they were not (test_moe.py counts the 2r adapters). ftl sets no pattern key."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=FUSED_PATTERN_WARNING, category=RuntimeWarning)
        yield
