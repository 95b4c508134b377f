"""strategy=auto: the fastest strategy that fits, the reasons, and a refusal that helps."""

from __future__ import annotations

import pytest

from launcher.auto import (
    DEEPSPEED_ORDER,
    choose_strategy,
    resolve_auto,
    strategy_settings,
)
from launcher.compose import compose_config
from launcher.errors import ConfigError
from launcher.estimate import STRATEGY_SHAPES, estimate

OFFLOAD = {"zero2_offload", "zero3_offload", "fsdp_offload"}


def auto_cfg(*overrides: str):
    return compose_config(["strategy=auto", *overrides])


def test_7b_on_8_a100_80g_picks_a_non_offload_strategy() -> None:
    cfg = auto_cfg("model=llama-7b", "precision=bf16", "cluster.gpu=a100-80g",
                   "cluster.gpus_per_node=8", "dataset.max_length=2048")
    name, reasons = choose_strategy(cfg)
    assert name not in OFFLOAD
    assert name == "zero1"  # ddp needs 20 bytes/param = 125 GiB
    assert reasons[0].startswith("ddp needs ") and "a100-80g has 80" in reasons[0]
    assert reasons[-1].startswith("zero1 fits")


def test_70b_on_8_a100_40g_offloads_or_refuses() -> None:
    cfg = auto_cfg("model=llama-70b", "precision=bf16", "cluster.gpu=a100-40g",
                   "cluster.gpus_per_node=8", "dataset.max_length=2048")
    try:
        name, reasons = choose_strategy(cfg)
    except ConfigError as error:
        assert "peft=lora" in str(error)
    else:
        assert name in OFFLOAD
        assert len(reasons) == DEEPSPEED_ORDER.index(name) + 1


def test_choice_is_the_first_fitting_row_in_order() -> None:
    cfg = auto_cfg("model=llama-13b", "precision=bf16", "cluster.gpu=a100-40g",
                   "cluster.gpus_per_node=8")
    rows = {r.strategy: r for r in estimate(cfg).strategies}
    name, _ = choose_strategy(cfg)
    index = DEEPSPEED_ORDER.index(name)
    assert rows[name].fits
    assert not any(rows[n].fits for n in DEEPSPEED_ORDER[:index])


def test_nothing_fits_refuses_with_fixes() -> None:
    cfg = auto_cfg("model=llama-70b", "precision=bf16", "cluster.gpu=a100-40g",
                   "cluster.gpus_per_node=1", "cluster.host_memory_gib=256",
                   "dataset.max_length=4096", "train.micro_batch_size=4")
    with pytest.raises(ConfigError) as caught:
        choose_strategy(cfg)
    text = str(caught.value)
    for fix in ("peft=qlora", "cluster.nodes=2", "dataset.max_length=2048",
                "train.gradient_checkpointing=true", "train.micro_batch_size=1"):
        assert fix in text, fix
    assert "cluster.host_memory_gib is 256" in text  # offload also rejected for host RAM
    assert len(caught.value.problems) == len(DEEPSPEED_ORDER) + 2


def test_lora_suggestion_is_checked_not_guessed() -> None:
    cfg = auto_cfg("model=llama-7b", "precision=bf16", "cluster.gpu=a100-40g",
                   "cluster.gpus_per_node=1", "cluster.host_memory_gib=64")
    with pytest.raises(ConfigError, match=r"peft=lora \(fits with ddp\)"):
        choose_strategy(cfg)


def test_fsdp_only_when_asked() -> None:
    base = ["model=llama-13b", "precision=bf16", "cluster.gpu=a100-80g",
            "cluster.gpus_per_node=8"]
    plain, _ = choose_strategy(auto_cfg(*base))
    asked, reasons = choose_strategy(auto_cfg(*base, "strategy.backend=fsdp"))
    assert not plain.startswith("fsdp")
    assert asked == "fsdp" and reasons[0].startswith("ddp needs")


def test_resolve_auto_takes_the_strategy_yaml_and_keeps_user_tweaks() -> None:
    cfg = auto_cfg("model=llama-70b", "precision=bf16", "cluster.gpu=a100-80g",
                   "cluster.gpus_per_node=8", "cluster.nodes=2", "strategy.overlap_comm=false")
    resolved = resolve_auto(cfg)
    name, _ = choose_strategy(cfg)
    assert resolved.strategy.name == name == "zero3"
    assert resolved.strategy.backend == "deepspeed" and resolved.strategy.zero_stage == 3
    assert resolved.strategy.overlap_comm is False
    assert cfg.strategy.name == "auto"  # the input is left alone


def test_resolve_auto_leaves_a_named_strategy_alone() -> None:
    cfg = compose_config(["strategy=zero2"])
    assert resolve_auto(cfg) == cfg


def test_every_strategy_yaml_loads() -> None:
    for name, shape in STRATEGY_SHAPES.items():
        settings = strategy_settings(name)
        assert settings.name == name
        assert settings.offload_param == shape.offload_param


def test_tiny_model_on_cpu_picks_ddp() -> None:
    name, reasons = choose_strategy(auto_cfg())
    assert name == "ddp" and len(reasons) == 1
