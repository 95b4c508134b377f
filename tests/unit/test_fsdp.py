"""FSDP2 settings: what TrainingArguments and accelerate's plugin make of them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from launcher.config.compose import compose_config
from launcher.config.schema import RunConfig
from launcher.engines.fsdp.settings import (
    build_fsdp_settings,
    fsdp_plugin_overrides,
    needs_unpinned_offload,
)
from launcher.errors import ConfigError
from launcher.validation.validate import validate


def cfg_for(*overrides: str) -> RunConfig:
    return compose_config(list(overrides))


@pytest.fixture
def clean_hf_state():
    """TrainingArguments sets FSDP_CPU_RAM_EFFICIENT_LOADING and accelerate's PartialState."""
    saved_env = dict(os.environ)
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ.clear()
    os.environ.update(saved_env)


def plugin_args(tmp_path: Path, settings: dict[str, Any]) -> dict[str, Any]:
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **settings)
    assert args.fsdp is True
    return args.fsdp_plugin_args


def test_fsdp_defaults() -> None:
    settings = build_fsdp_settings(cfg_for("strategy=fsdp"))
    assert settings == {
        "fsdp": True,
        "fsdp_config": {
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            "reshard_after_forward": True,
            "cpu_offload": False,
            "state_dict_type": "FULL_STATE_DICT",
            "cpu_ram_efficient_loading": True,  # rank 0 builds, the others get its weights
            "activation_checkpointing": False,
        },
    }


def test_fields_follow_the_run_config() -> None:
    cfg = cfg_for(
        "model=mistral-7b", "strategy=fsdp", "strategy.fsdp_reshard_after_forward=false",
        "strategy.gather_weights_on_save=false", "train.gradient_checkpointing=true",
    )  # fmt: skip
    fsdp_config = build_fsdp_settings(cfg)["fsdp_config"]
    assert fsdp_config["transformer_layer_cls_to_wrap"] == [cfg.model.decoder_layer]
    assert cfg.model.decoder_layer == "MistralDecoderLayer"
    assert fsdp_config["reshard_after_forward"] is False
    assert fsdp_config["state_dict_type"] == "SHARDED_STATE_DICT"
    assert fsdp_config["activation_checkpointing"] is True
    assert fsdp_config["cpu_ram_efficient_loading"] is True


def test_half_offload_is_refused_by_validation() -> None:
    with pytest.raises(ConfigError, match="strategy.offload_param=false"):
        validate(cfg_for("strategy=fsdp", "strategy.offload_optimizer=true"), "plan")


@pytest.mark.usefixtures("clean_hf_state")
def test_training_arguments_turn_settings_into_fsdp2_plugin_args(tmp_path: Path) -> None:
    cfg = cfg_for(
        "strategy=fsdp", "strategy.fsdp_reshard_after_forward=false",
        "strategy.gather_weights_on_save=false", "train.gradient_checkpointing=true",
    )  # fmt: skip
    assert plugin_args(tmp_path, build_fsdp_settings(cfg)) == {
        "fsdp_version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_cls_names_to_wrap": "LlamaDecoderLayer",
        "cpu_ram_efficient_loading": True,
        "state_dict_type": "SHARDED_STATE_DICT",
        "activation_checkpointing": True,
        "reshard_after_forward": False,
    }


@pytest.mark.usefixtures("clean_hf_state")
def test_accelerate_builds_the_plugin_with_unpinned_cpu_offload(tmp_path: Path) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    cfg = cfg_for("strategy=fsdp_offload")
    assert needs_unpinned_offload(cfg)
    args = plugin_args(tmp_path, build_fsdp_settings(cfg))
    assert args["cpu_offload"] is True
    # What the worker does between TrainingArguments and Trainer (Trainer builds the plugin
    # from args.fsdp_plugin_args).
    args.update(fsdp_plugin_overrides(cfg))
    plugin = FullyShardedDataParallelPlugin(**args)
    assert plugin.fsdp_version == 2
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy)
    assert plugin.cpu_offload.pin_memory is False
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.state_dict_type.name == "FULL_STATE_DICT"


def test_no_override_on_a_gpu_or_without_offload() -> None:
    gpu = cfg_for("strategy=fsdp_offload", "cluster.gpu=a100-80g", "cluster.gpus_per_node=8")
    assert not needs_unpinned_offload(gpu) and fsdp_plugin_overrides(gpu) == {}
    plain = cfg_for("strategy=fsdp")
    assert not needs_unpinned_offload(plain) and fsdp_plugin_overrides(plain) == {}
