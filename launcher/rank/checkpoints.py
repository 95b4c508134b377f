"""The final model (RUN_DIR/model): a plain HF directory whatever the strategy."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def save_final_model(trainer: Any, is_peft: bool, model_dir: Path, base_path: str = "") -> Path:
    """A plain HF directory that AutoModelForCausalLM.from_pretrained loads.

    Called on every rank: gathering ZeRO-3 / FSDP2 weights is a collective; rank 0 writes.
    """
    if trainer.is_fsdp_enabled:
        # Sharded checkpoints are right for resuming; the final model must be whole.
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    if is_peft:
        return save_merged_peft_model(trainer, model_dir, base_path)
    trainer.save_model(str(model_dir))  # ZeRO-3: gathered (stage3_gather_16bit_...)
    barrier()
    if trainer.is_world_process_zero() and not _has_weights(model_dir):
        consolidate_zero_checkpoint(trainer, model_dir)
    barrier()
    return model_dir


def consolidate_zero_checkpoint(trainer: Any, model_dir: Path) -> None:
    """ZeRO-3 without gathering on save left shards: rebuild fp32 weights (zero_to_fp32)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state_dict = get_fp32_state_dict_from_zero_checkpoint(str(model_dir))
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.save_pretrained(str(model_dir), state_dict=state_dict)
    # The shards (with optimizer states) stay in checkpoints/; model/ is a plain HF dir.
    names = ("latest", "zero_to_fp32.py", "zero_to_torch.py")
    for leftover in [*model_dir.glob("global_step*"), *(model_dir / name for name in names)]:
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink(missing_ok=True)


def save_merged_peft_model(trainer: Any, model_dir: Path, base_path: str) -> Path:
    """model_dir/adapter (the PEFT adapter) and model_dir itself: the base model with the
    LoRA update merged in, loadable without peft. Works sharded: the full state dict is
    gathered (a collective), rank 0 merges it on CPU. QLoRA merges into the unquantized
    base weights read from `base_path` (the usual practice: 4-bit weights are lossy)."""
    trainer.save_model(str(model_dir / "adapter"))
    state_dict = _full_state_dict(trainer)
    # gathered (ZeRO, FSDP): fresh host tensors nobody else holds, merged in place; the
    # plain model's own state dict shares the live weights, so that one is copied
    gathered = trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled
    if trainer.is_world_process_zero() and state_dict is not None:
        from safetensors.torch import save_file

        peft_model = trainer.accelerator.unwrap_model(trainer.model)
        base_model = peft_model.get_base_model()
        lora = peft_model.peft_config["default"]
        scaling = lora.lora_alpha / (lora.r**0.5 if lora.use_rslora else lora.r)
        quantized = getattr(base_model, "is_loaded_in_4bit", False)
        base = _read_safetensors(Path(base_path)) if quantized else None
        merged = merge_lora_state_dict(state_dict, scaling, base, copy=not gathered)
        save_file(merged, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
        config = base_model.config
        if quantized:
            config = type(config).from_pretrained(base_path)  # without quantization_config
        config.save_pretrained(str(model_dir))
        trainer.processing_class.save_pretrained(str(model_dir))
    barrier()
    return model_dir


def _full_state_dict(trainer: Any) -> dict[str, Any] | None:
    """Whole weights on rank 0, gathered by accelerate (other ranks may get partial dicts)."""
    model = trainer.deepspeed if trainer.is_deepspeed_enabled else trainer.model
    try:
        return trainer.accelerator.get_state_dict(model)
    except ValueError:  # ZeRO-3 without gather-on-save: only the adapter is written
        if not trainer.is_deepspeed_enabled:
            raise
        print("[ftl] ZeRO-3 weights not gathered on save: model/adapter only", flush=True)
        return None


def _read_safetensors(model_path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for shard in sorted(model_path.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    return state


LORA_A, LORA_B = ".lora_A.default.weight", ".lora_B.default.weight"


def merge_lora_state_dict(
    state_dict: dict[str, Any], scaling: float, base: dict[str, Any] | None = None,
    copy: bool = True,
) -> dict[str, Any]:
    """PEFT LoRA state dict -> the base model's weights with W + scaling * B @ A.
    `base`: the base weights by their plain names; default: the (unquantized) base layers
    in `state_dict`. Each weight is merged in place; `copy=False` when the base tensors are
    host tensors no one else uses (a gathered state dict), so no second copy of the base is
    made first (rank 0 held the gathered base twice: ~13 GiB more for a 7B bf16 base)."""
    if base is None:
        base = {
            key.removeprefix("base_model.model.").replace(".base_layer.", "."): value
            for key, value in state_dict.items()
            if ".lora_" not in key
        }
    merged: dict[str, Any] = {}
    for name, value in base.items():  # one at a time: a copied base is never held twice
        host = value.detach().cpu().contiguous()
        merged[name] = host.clone() if copy else host
    for key, a in state_dict.items():
        if not key.endswith(LORA_A):
            continue
        prefix = key.removesuffix(LORA_A)
        b = state_dict[prefix + LORA_B]
        name = prefix.removeprefix("base_model.model.") + ".weight"
        weight = merged[name]
        delta = scaling * (b.detach().cpu().float() @ a.detach().cpu().float())
        weight.copy_((weight.float() + delta).to(weight.dtype))  # in place: no second base
    return merged


def _has_weights(model_dir: Path) -> bool:
    return any(model_dir.glob("*.safetensors")) or any(model_dir.glob("pytorch_model*.bin"))


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
