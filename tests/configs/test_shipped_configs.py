"""Every shipped config composes; every model x strategy x precision validates or fails
with the documented error; every plan carries the strategy's own settings.

Hydra composition is the cost here (~0.1 s each, against ~10 ms for validate + plan), so
each model, strategy and precision is composed once and the combinations are assembled
from those group nodes before the typed RunConfig is made (`combination`, the same steps
as compose_config): config.yaml merges each group into its own node, and what crosses
groups (run.name's interpolation) is resolved afterwards, which
test_combination_is_what_hydra_composes checks."""

from __future__ import annotations

import copy
import functools
from itertools import cycle, islice
from pathlib import Path

import pytest
from omegaconf import DictConfig

from launcher.config.compose import (
    compose_config,
    compose_dict,
    config_dir,
    resolve_paths,
    to_run_config,
)
from launcher.config.schema import RunConfig
from launcher.errors import ConfigError
from launcher.run.planner import make_plan
from launcher.validation.validate import validate

CONFIGS = config_dir()


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIGS / group).glob("*.yaml"))


MODELS = options("model")
STRATEGIES = [name for name in options("strategy") if name != "auto"]
PRECISIONS = options("precision")
ALL_FILES = sorted(CONFIGS.rglob("*.yaml"))
GROUPS = sorted({p.parent.name for p in ALL_FILES if p.parent != CONFIGS})
SLURM = ("cluster=slurm", "cluster.gpu=a100-80g", "cluster.nodes=2")  # 2 x 8 A100-80G


def pairwise(*factors: list[str]) -> list[object]:
    """Every combination of the factors; `make test` runs the pairwise-covering share (each
    pair of values of any two factors at least once: the i-th model and the j-th strategy
    take the (i + j)-th precision), `make test-full` the rest too. Each rule these tests
    check depends on one factor or on a pair, never on all three at once."""
    import itertools

    combos = []
    for indices in itertools.product(*(range(len(f)) for f in factors)):
        values = [f[i] for f, i in zip(factors, indices, strict=True)]
        covering = len(indices) < 3 or indices[2] == (indices[0] + indices[1]) % len(factors[2])
        combos.append(pytest.param(*values, marks=[] if covering else [pytest.mark.full]))
    return combos

# What docs/README say each strategy is, written out rather than read from the yaml.
ZERO_STAGE = {"zero1": 1, "zero2": 2, "zero2_offload": 2, "zero3": 3, "zero3_offload": 3}
OFFLOADS_OPTIMIZER = {"zero2_offload", "zero3_offload", "fsdp_offload"}
OFFLOADS_PARAMS = {"zero3_offload", "fsdp_offload"}
DECODER_LAYER = {"llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer",
                 "qwen2": "Qwen2DecoderLayer", "qwen3": "Qwen3DecoderLayer",
                 "qwen3_moe": "Qwen3MoeDecoderLayer", "mixtral": "MixtralDecoderLayer",
                 "gemma3_text": "Gemma3DecoderLayer"}  # the HF class names FSDP wraps
A100_PEAK = {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12}  # dense, NVIDIA's datasheet


@functools.cache
def composed(*overrides: str) -> DictConfig:
    return compose_dict(list(overrides))


def combination(model: str, strategy: str, precision: str, *cluster: str) -> RunConfig:
    """compose_config([model=, strategy=, precision=, *cluster]) from cached compositions:
    the model and cluster by Hydra, the strategy and precision nodes from their own."""
    cfg = copy.deepcopy(composed(f"model={model}", *cluster))
    cfg.strategy = copy.deepcopy(composed(f"strategy={strategy}").strategy)
    cfg.precision = copy.deepcopy(composed(f"precision={precision}").precision)
    return resolve_paths(to_run_config(cfg), Path.cwd())


def test_groups_have_the_documented_options() -> None:
    assert set(STRATEGIES) == {"ddp", "zero1", "zero2", "zero2_offload", "zero3",
                               "zero3_offload", "fsdp", "fsdp_offload"}
    assert set(PRECISIONS) == {"fp32", "fp16", "bf16"}
    assert {"tiny-llama", "llama-7b", "llama-13b", "llama-70b", "mistral-7b",
            "qwen2.5-7b", "llama-3.1-8b", "llama-3.1-70b", "qwen3-8b", "qwen3-32b",
            "qwen3-30b-a3b", "gemma-3-12b", "mixtral-8x7b", "tiny-moe"} <= set(MODELS)
    assert set(options("cluster")) == {"local", "slurm"}
    assert set(options("peft")) == {"none", "lora", "qlora"}


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_opens_with_its_command(path: Path) -> None:
    lines = path.read_text().splitlines()
    # Hydra's `# @package` header must come first; the command line follows it.
    first_line = lines[1] if lines[0].startswith("# @package") else lines[0]
    assert first_line.startswith("# ") and "ftl " in first_line


def option_rounds() -> list[dict[str, str]]:
    """Every option of every group in as few compositions as the largest group needs:
    round i picks each group's i-th option (cycling through the shorter groups)."""
    per_group = {g: options(g) for g in GROUPS}
    rounds = max(len(names) for names in per_group.values())
    columns = {g: list(islice(cycle(names), rounds)) for g, names in per_group.items()}
    return [{g: columns[g][i] for g in GROUPS} for i in range(rounds)]


def test_option_rounds_cover_every_group_file() -> None:
    covered = {(g, name) for chosen in option_rounds() for g, name in chosen.items()}
    assert covered == {(p.parent.name, p.stem) for p in ALL_FILES if p.parent != CONFIGS}


@pytest.mark.parametrize("chosen", option_rounds(),
                         ids=lambda c: ",".join(f"{g}={n}" for g, n in c.items()))
def test_every_group_option_composes(chosen: dict[str, str]) -> None:
    cfg = compose_config([f"{g}={name}" for g, name in chosen.items()])
    assert {g: getattr(cfg, g).name for g in chosen} == chosen


@pytest.mark.parametrize("strategy, precision",
                         [(s, "bf16") for s in STRATEGIES] + [("zero3", p) for p in PRECISIONS])
def test_combination_is_what_hydra_composes(strategy: str, precision: str) -> None:
    overrides = [f"strategy={strategy}", f"precision={precision}", *SLURM]
    assert combination("qwen2.5-7b", strategy, precision, *SLURM) == compose_config(
        ["model=qwen2.5-7b", *overrides])


@pytest.mark.parametrize(("model", "strategy", "precision"),
                         pairwise(MODELS, STRATEGIES, PRECISIONS))
def test_gpu_cluster_matrix_plans_the_strategys_settings(
    model: str, strategy: str, precision: str
) -> None:
    cfg = combination(model, strategy, precision, *SLURM)
    plan = make_plan(validate(cfg, "plan"))
    assert plan.cfg.strategy.name == strategy and plan.estimate["strategy"] == strategy
    assert plan.peak_flops_per_device == A100_PEAK[precision]
    if strategy in ZERO_STAGE:
        ds = plan.settings
        assert plan.settings_file == "ds_config.json"
        assert ds["zero_optimization"]["stage"] == ZERO_STAGE[strategy]
        offload = ds["zero_optimization"]
        assert ("offload_optimizer" in offload) == (strategy in OFFLOADS_OPTIMIZER)
        assert ("offload_param" in offload) == (strategy in OFFLOADS_PARAMS)
        assert all(offload[k] == {"device": "cpu", "pin_memory": True}
                   for k in ("offload_optimizer", "offload_param") if k in offload)
        assert ds["fp16"]["enabled"] == (precision == "fp16")
        assert ds["bf16"]["enabled"] == (precision == "bf16")
        assert ds["train_batch_size"] == 16 * ds["train_micro_batch_size_per_gpu"] * ds[
            "gradient_accumulation_steps"]
        assert ds["optimizer"]["type"] == "AdamW"  # a GPU preset: DeepSpeed's own AdamW
    elif strategy.startswith("fsdp"):
        fsdp = plan.settings["fsdp_config"]
        assert plan.settings_file == "fsdp.json"
        assert fsdp["transformer_layer_cls_to_wrap"] == [
            DECODER_LAYER[cfg.model.architecture]]
        assert fsdp["cpu_offload"] == (strategy in OFFLOADS_PARAMS)
    else:
        assert strategy == "ddp"
        assert plan.settings is None and plan.settings_file is None


@pytest.mark.parametrize(("model", "strategy"), [
    pytest.param(m, s, marks=[] if j == i % len(STRATEGIES) else [pytest.mark.full])
    for i, m in enumerate(MODELS) for j, s in enumerate(STRATEGIES)])
def test_fp16_on_cpu_fails_with_documented_error(model: str, strategy: str) -> None:
    """`make test`: every model once and every strategy once (the refusal is precision's
    on the CPU preset, whatever the pair); `make test-full`: every pair."""
    cfg = combination(model, strategy, "fp16")
    with pytest.raises(ConfigError) as caught:
        validate(cfg, "plan")
    assert any("precision=fp16" in problem and "Fix:" in problem
               for problem in caught.value.problems)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_on_v100_fails_with_documented_error(strategy: str) -> None:
    cfg = combination("tiny-llama", strategy, "bf16", "cluster.gpu=v100-32g")
    with pytest.raises(ConfigError, match=r"precision=bf16: cluster.gpu=v100-32g"):
        validate(cfg, "plan")
