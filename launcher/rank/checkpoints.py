"""Which checkpoint a run resumes from and what makes one complete: its COMPLETE marker,
written by rank 0 once every rank has written its part (callbacks/checkpoint_marker.py).
Then the final model (RUN_DIR/model), a plain HF directory whatever the strategy.

No torch import at module level: the CLI and the Slurm code call
`latest_complete_checkpoint` too.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from launcher.rundir import COMPLETE_MARKER, RunDir, read_complete_marker


def checkpoint_step(path: Path) -> int | None:
    """N for a directory named checkpoint-N, else None."""
    match = re.match(r"checkpoint-(\d+)$", path.name)
    return int(match.group(1)) if match else None


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """checkpoint-N directories of `checkpoints_dir`, oldest step first."""
    if not checkpoints_dir.is_dir():
        return []
    found = [p for p in checkpoints_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / COMPLETE_MARKER).is_file()


def latest_complete_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The highest-step checkpoint with a COMPLETE marker; half-written ones are skipped."""
    complete = [p for p in list_checkpoints(checkpoints_dir) if is_complete(p)]
    return complete[-1] if complete else None


def checkpoint_world_size(checkpoint: Path) -> int | None:
    """The number of ranks that wrote `checkpoint` (from its COMPLETE marker)."""
    marker = read_complete_marker(checkpoint)
    return marker.world_size if marker else None


def latest_in_earlier_runs(run_root: Path) -> Path | None:
    """What run.resume=auto continues: the newest complete checkpoint of earlier launches of
    a run name (outputs/<run.name>/<timestamp>, newest first); a finished launch (its
    result.json) ends the search, so the same command then trains anew."""
    if not run_root.is_dir():
        return None
    runs = sorted((p for p in run_root.iterdir() if p.is_dir()), reverse=True)
    for run in (RunDir(path) for path in runs):
        if run.result.exists():
            return None
        found = latest_complete_checkpoint(run.checkpoints)
        if found is not None:
            return found
    return None


def resume_checkpoint(resume: str, run_dir: RunDir) -> Path | None:
    """What a rank loads: its own run dir's newest complete checkpoint (a requeued job's),
    else the one the launcher chose and validated (RUN_DIR/resume_from)."""
    if resume == "never":
        return None
    own = latest_complete_checkpoint(run_dir.checkpoints)
    if own is not None or not run_dir.resume_from.is_file():
        return own
    recorded = Path(run_dir.resume_from.read_text().strip())
    return recorded if is_complete(recorded) else None


# --- the final model ---------------------------------------------------------------------


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
