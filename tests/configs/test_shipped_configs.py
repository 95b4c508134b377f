"""Every shipped config composes; every model x strategy x precision validates or fails
with the documented error; every DeepSpeed combination yields a ds_config."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.compose import compose_config, config_dir
from launcher.errors import ConfigError
from launcher.planner import make_plan
from launcher.validate import validate

CONFIGS = config_dir()


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIGS / group).glob("*.yaml"))


MODELS = options("model")
STRATEGIES = [name for name in options("strategy") if name != "auto"]
PRECISIONS = options("precision")
ALL_FILES = sorted(CONFIGS.rglob("*.yaml"))


def test_groups_have_the_documented_options() -> None:
    assert set(STRATEGIES) == {"ddp", "zero1", "zero2", "zero2_offload", "zero3",
                               "zero3_offload", "fsdp", "fsdp_offload"}
    assert set(PRECISIONS) == {"fp32", "fp16", "bf16"}
    assert {"tiny-llama", "llama-7b", "llama-13b", "llama-70b", "mistral-7b",
            "qwen2.5-7b"} <= set(MODELS)
    assert set(options("cluster")) == {"local", "slurm"}
    assert set(options("peft")) == {"none", "lora", "qlora"}


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_opens_with_its_command(path: Path) -> None:
    lines = path.read_text().splitlines()
    # Hydra's `# @package` header must come first; the command line follows it.
    first_line = lines[1] if lines[0].startswith("# @package") else lines[0]
    assert first_line.startswith("# ") and "ftl " in first_line


@pytest.mark.parametrize("path", [p for p in ALL_FILES if p.parent != CONFIGS],
                         ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_group_option_composes(path: Path) -> None:
    cfg = compose_config([f"{path.parent.name}={path.stem}"])
    assert getattr(cfg, path.parent.name).name == path.stem


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model", MODELS)
def test_gpu_cluster_matrix_validates(model: str, strategy: str, precision: str) -> None:
    cfg = compose_config([f"model={model}", f"strategy={strategy}", f"precision={precision}",
                          "cluster=slurm", "cluster.gpu=a100-80g", "cluster.nodes=2"])
    plan = make_plan(validate(cfg, "plan"))
    if cfg.strategy.backend == "deepspeed":
        assert plan.ds_config is not None
        assert plan.ds_config["zero_optimization"]["stage"] == cfg.strategy.zero_stage
    if cfg.strategy.backend == "fsdp":
        assert plan.fsdp_settings is not None


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model", MODELS)
def test_fp16_on_cpu_fails_with_documented_error(model: str, strategy: str) -> None:
    cfg = compose_config([f"model={model}", f"strategy={strategy}", "precision=fp16"])
    with pytest.raises(ConfigError) as caught:
        validate(cfg, "plan")
    assert any("precision=fp16" in problem and "Fix:" in problem
               for problem in caught.value.problems)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_on_v100_fails_with_documented_error(strategy: str) -> None:
    cfg = compose_config([f"strategy={strategy}", "precision=bf16", "cluster.gpu=v100-32g"])
    with pytest.raises(ConfigError, match=r"precision=bf16: cluster.gpu=v100-32g"):
        validate(cfg, "plan")
