"""FSDP2 settings for TrainingArguments (`fsdp`, `fsdp_config`) from a RunConfig.

Keys checked against the installed sources, transformers 5.24
(`TrainingArguments._process_fsdp_args`) and accelerate 1.15
(`FullyShardedDataParallelPlugin`):

- `fsdp` is `True`: a string such as "full_shard auto_wrap offload" still parses but logs
  "Passing `fsdp` as a string is deprecated"; transformers now reads everything from
  `fsdp_config`.
- `fsdp_config` keys: version (2 = FSDP2; 1 is deprecated), reshard_after_forward (bool
  in FSDP2: true = full_shard, false = shard_grad_op), cpu_offload, auto_wrap_policy
  (TRANSFORMER_BASED_WRAP), transformer_layer_cls_to_wrap (list of class names),
  state_dict_type (FULL_STATE_DICT | SHARDED_STATE_DICT), cpu_ram_efficient_loading,
  activation_checkpointing. transformers turns them into `args.fsdp_plugin_args`, and the
  Trainer builds `FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)`.
- `cpu_offload: true` becomes accelerate's `CPUOffloadPolicy()`, whose pin_memory=True
  fails without a GPU (docs/evidence/stack.md): fsdp_plugin_overrides.
"""

from __future__ import annotations

from typing import Any

from launcher.config.hardware import gpu_preset
from launcher.config.schema import RunConfig


def build_fsdp_settings(cfg: RunConfig) -> dict[str, Any]:
    """`TrainingArguments(**build_fsdp_settings(cfg), ...)` keyword arguments for FSDP2."""
    strategy = cfg.strategy  # validation checked backend and offload settings (rules.py)
    full_state = strategy.gather_weights_on_save
    return {
        "fsdp": True,
        "fsdp_config": {
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "transformer_layer_cls_to_wrap": [cfg.model.decoder_layer],
            "reshard_after_forward": strategy.fsdp_reshard_after_forward,
            "cpu_offload": strategy.offload_param,
            # FULL: one HF-loadable model.safetensors at save; SHARDED: one file per rank.
            "state_dict_type": "FULL_STATE_DICT" if full_state else "SHARDED_STATE_DICT",
            # accelerate moves the model to meta and fills every shard from RANK 0's weights
            # by broadcast; the other ranks build theirs on meta (launcher/rank/model.py), so
            # only rank 0 ever holds the whole model, pretrained or built from config.
            "cpu_ram_efficient_loading": True,
            # FSDP's own checkpointing; TrainingArguments.gradient_checkpointing would add a
            # redundant all-gather in backward (transformers issue 30404), so the worker
            # must leave that one off under FSDP.
            "activation_checkpointing": cfg.train.gradient_checkpointing,
        },
    }


def needs_unpinned_offload(cfg: RunConfig) -> bool:
    """FSDP2 offloads on the cpu preset, where pinned memory is unavailable."""
    return cfg.strategy.offload_param and gpu_preset(cfg.cluster.gpu).is_cpu


def fsdp_plugin_overrides(cfg: RunConfig) -> dict[str, Any]:
    """Entries for `args.fsdp_plugin_args` that fsdp_config cannot express (imports torch:
    the ranks only, FsdpEngine.training_arguments)."""
    if not needs_unpinned_offload(cfg):
        return {}
    from torch.distributed.fsdp import CPUOffloadPolicy

    return {"cpu_offload": CPUOffloadPolicy(pin_memory=False)}
