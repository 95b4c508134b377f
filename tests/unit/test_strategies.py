"""The strategy table: configs/strategy/*.yaml is the one list every module reads, so a new
strategy is a new YAML file and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from launcher.config.compose import compose_config, config_dir
from launcher.config.strategies import concrete_strategies, strategy_table
from launcher.engines import engine_of
from launcher.engines.deepspeed.ds_config import (
    build_ds_config,
    deepspeed_strategies,
    reference_files,
)
from launcher.estimator.auto import auto_ladder, candidates, choose, resolve
from launcher.estimator.estimate import estimate

NEW_STRATEGY = """\
# a site's own variant: ZeRO-2 without overlapping communication
name: zero2_nocomm
backend: deepspeed
zero_stage: 2
overlap_comm: false
auto_rank: 2
"""


def test_table_loads_every_yaml_as_hydra_composes_it() -> None:
    table = strategy_table()
    files = sorted(p.stem for p in (config_dir() / "strategy").glob("*.yaml"))
    assert sorted(table) == files
    for name, settings in table.items():
        assert compose_config([f"strategy={name}"]).strategy == settings, name


def test_concrete_strategies_leave_out_auto() -> None:
    assert "auto" in strategy_table()
    assert "auto" not in concrete_strategies()
    assert len(concrete_strategies()) == len(strategy_table()) - 1


def test_deepspeed_strategies() -> None:
    assert deepspeed_strategies() == (
        "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload",
    )


def test_auto_ladders_fastest_first() -> None:
    assert auto_ladder("deepspeed") == (
        "ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload",
    )
    assert auto_ladder("auto") == auto_ladder("deepspeed")  # plain strategy=auto
    assert auto_ladder("fsdp") == ("ddp", "fsdp", "fsdp_offload")


def test_fsdp_behaves_like_zero3() -> None:
    table = strategy_table()
    assert engine_of(table["fsdp"]).memory_stage(table["fsdp"]) == 3
    assert engine_of(table["fsdp_offload"]).memory_stage(table["fsdp_offload"]) == 3
    assert engine_of(table["zero2"]).memory_stage(table["zero2"]) == 2
    assert engine_of(table["ddp"]).memory_stage(table["ddp"]) == 0


@pytest.fixture
def site_configs(site_strategy: Callable[[str], Path]) -> Path:
    return site_strategy(NEW_STRATEGY)


def test_a_new_yaml_is_a_new_strategy_everywhere(site_configs: Path) -> None:
    assert "zero2_nocomm" in deepspeed_strategies()
    assert auto_ladder("deepspeed") == (
        "ddp", "zero1", "zero2", "zero2_nocomm", "zero3", "zero2_offload", "zero3_offload",
    )
    cfg = compose_config(["strategy=auto", "cluster.gpus_per_node=2"])
    assert "zero2_nocomm" in candidates(cfg)
    est = estimate(cfg)
    new, zero2 = est.row("zero2_nocomm"), est.row("zero2")
    assert new is not None and zero2 is not None
    assert new.gpu_bytes == zero2.gpu_bytes  # same ZeRO stage, same memory

    for name in ("ddp", "zero1", "zero2"):  # pretend the faster ones do not fit
        est.row(name).fits = est.row(name).fits_gpu = False
    name, _ = choose(cfg, est)
    assert name == "zero2_nocomm"
    resolved = resolve(cfg, name)
    assert resolved.strategy.name == "zero2_nocomm"
    assert resolved.strategy.overlap_comm is False
    ds = build_ds_config(resolved)
    assert ds["zero_optimization"]["stage"] == 2
    assert ds["zero_optimization"]["overlap_comm"] is False


def test_a_new_deepspeed_yaml_gets_reference_ds_configs(site_configs: Path) -> None:
    files = reference_files()
    assert {"zero2_nocomm_fp32.json", "zero2_nocomm_bf16.json"} <= set(files)
