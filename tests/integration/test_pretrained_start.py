"""Fine-tuning that starts from a pretrained checkpoint on disk (`model.path=DIR
model.tokenizer=`, the tokenizer from DIR too), 2 CPU ranks, the tiny-llama preset and the
bundled data. DIR is the model/ of the suite's own plain DDP run (`pretrained_dir`).

The proof that the weights came from DIR: the run's FIRST eval loss (eval_on_start, before
any step) equals DIR's own eval loss on the same eval data, i.e. the final eval of the run
that saved DIR, and is far below a fresh init's (that run's first eval, about ln(512)).
If model.path were ignored, or if any rank's shard held anything but DIR's values, the
first eval loss would be a fresh init's or worse. LoRA starts with lora_B = 0, so its first
eval is DIR's too.

How the strategies load, from the LoadingProbe (tests/integration/probes.py), at the end of
Trainer.__init__, before the strategy wraps the model:
- ZeRO-3: every base parameter is already partitioned (half on each rank): transformers
  constructed the model inside deepspeed.zero.Init (TrainingArguments came first) and
  rank 0 copied the checkpoint into the gathered parameters.
- FSDP2: cpu_ram_efficient_loading is on (accelerate's plugin and the environment flag),
  and ranks other than 0 have their parameters zeroed by the probe before fully_shard:
  the run still starts at DIR's loss, so the shards were filled by rank 0's broadcast.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from runs import Run, describe_failure
from test_train_peft import WRAPPED, assert_only_adapters_changed

pytestmark = pytest.mark.slow

WORLD, MAX_STEPS = 2, 8
REL_TOL = 1e-3  # first eval vs. the checkpoint's own eval loss: same weights, same data
PROBES = "tests.integration.probes"


def probes(*specs: str) -> str:
    """train.callbacks from probe specs: "Name" or "Name,key:value"."""
    return "train.callbacks=[" + ",".join(f"{{_target_:{PROBES}.{s}}}" for s in specs) + "]"


def perturbing_loader(strategy: str) -> str:
    # Zeroing the non-zero ranks' weights is harmless only where rank 0 broadcasts (FSDP2
    # with cpu_ram_efficient_loading); under ZeRO-3 the partitions are already final.
    return "LoadingProbe,perturb_other_ranks:true" if strategy == "fsdp" else "LoadingProbe"


def full_overrides(pretrained: Path, strategy: str) -> list[str]:
    return [
        f"strategy={strategy}",
        f"model.path={pretrained}",
        "model.tokenizer=",
        "train.eval_on_start=true",
        probes(perturbing_loader(strategy), "WrapperProbe", "LogitsProbe"),
    ]


def lora_overrides(pretrained: Path, strategy: str) -> list[str]:
    return [
        f"strategy={strategy}",
        "peft=lora",
        f"model.path={pretrained}",
        "model.tokenizer=",
        "train.eval_on_start=true",
        probes(perturbing_loader(strategy), "ParamChecksumProbe", "LogitsProbe",
               "WrapperProbe"),
    ]


def full_run(trained: Callable[..., Run], pretrained: Path, strategy: str) -> Run:
    return trained(f"pretrained-{strategy}-fp32", full_overrides(pretrained, strategy))


def lora_run(trained: Callable[..., Run], pretrained: Path, strategy: str) -> Run:
    return trained(f"pretrained-lora-{strategy}-fp32", lora_overrides(pretrained, strategy))


def source_result(pretrained: Path) -> dict[str, Any]:
    """result.json of the run that saved the checkpoint (next to it, see pretrained_dir)."""
    return json.loads((pretrained.parent / "result.json").read_text())


def assert_starts_from_checkpoint(run: Run, pretrained: Path) -> dict[str, Any]:
    assert run.returncode == 0, describe_failure(run)
    result, source = run.result, source_result(pretrained)
    assert result["world_size"] == WORLD and result["global_step"] == MAX_STEPS, result
    evals = [m for m in run.metrics() if "eval_loss" in m]
    assert evals and evals[0]["step"] == 0, evals  # evaluated before the first step
    first, own = result["first_eval_loss"], source["final_eval_loss"]
    assert first == pytest.approx(own, rel=REL_TOL), (
        f"first eval loss {first} is not the checkpoint's own eval loss {own}: "
        "the run did not start from model.path's weights"
    )
    fresh = source["first_eval_loss"]  # the same architecture freshly initialised
    assert fresh > math.log(512) - 0.5, source
    assert first < fresh - 0.5, (first, fresh)
    return result


def assert_saved_model_reproduces_logits(run: Run) -> Any:
    from transformers import AutoModelForCausalLM

    recorded = run.logits()
    model = AutoModelForCausalLM.from_pretrained(run.run_dir / "model").eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        logits = model(input_ids=recorded["input_ids"]).logits.float()
    assert torch.allclose(logits, recorded["logits"], atol=1e-4), (
        (logits - recorded["logits"]).abs().max().item()
    )
    return logits


def pretrained_logits(pretrained: Path, input_ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(pretrained).eval()
    with torch.no_grad():
        return model(input_ids=input_ids).logits.float()


# FSDP2's full fine-tune is `make test-full`'s: its loading is the LoRA run's
# (test_fsdp_loads_with_cpu_ram_efficient_loading), its full training the strategy runs'.
# ddp's too: zero3's case makes the same assertions on the same from_pretrained read, and
# test_dpo.py's fsdp case fine-tunes from this checkpoint as well.
@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=pytest.mark.full), "zero3",
                                      pytest.param("fsdp", marks=pytest.mark.full)])
def test_full_finetune_starts_from_model_path(
    trained: Callable[..., Run], pretrained_dir: Path, strategy: str
) -> None:
    run = full_run(trained, pretrained_dir, strategy)
    result = assert_starts_from_checkpoint(run, pretrained_dir)
    assert result["final_eval_loss"] < result["first_eval_loss"], result  # it trains on
    # Every weight trained: the saved model reproduces the trained one, not the checkpoint.
    logits = assert_saved_model_reproduces_logits(run)
    before = pretrained_logits(pretrained_dir, run.logits()["input_ids"])
    assert (logits - before).abs().max() > 1e-2


def test_zero3_constructs_the_model_partitioned(
    trained: Callable[..., Run], pretrained_dir: Path
) -> None:
    """Before DeepSpeed's engine exists, every parameter is already a ZeRO-3 partition
    (half per rank): from_pretrained built the model inside deepspeed.zero.Init. With LoRA
    the adapters, added after loading, are the only unpartitioned parameters."""
    full = full_run(trained, pretrained_dir, "zero3")
    assert full.returncode == 0, describe_failure(full)
    for rank in range(WORLD):
        loading = full.probe("loading", rank)
        assert loading["zero3_partitioned"] == loading["param_count"] > 0, loading
        assert loading["zero3_local_fraction"] == pytest.approx(0.5, abs=0.01), loading
        assert loading["meta_params"] == 0, loading
        wrapper = full.probe("wrapper", rank)
        assert wrapper["zero_stage"] == 3 and wrapper["param_local_fraction"] == 0.5, wrapper

    lora = lora_run(trained, pretrained_dir, "zero3")
    assert lora.returncode == 0, describe_failure(lora)
    for rank in range(WORLD):
        loading = lora.probe("loading", rank)
        assert loading["zero3_partitioned"] > 0, loading
        assert loading["unpartitioned"], loading
        assert all("lora_" in name for name in loading["unpartitioned"]), loading


def test_fsdp_loads_with_cpu_ram_efficient_loading(
    trained: Callable[..., Run], pretrained_dir: Path
) -> None:
    """cpu_ram_efficient_loading is on, and rank 0's weights are what every shard holds:
    rank 1 built unfilled parameters without reading the checkpoint (zeroing them before
    fully_shard changes nothing), yet the run starts at the checkpoint's loss. On the LoRA
    run (its adapters start at zero, so its first eval is the checkpoint's too), which
    test_lora_starts_from_model_path makes anyway; the full fine-tune loads the same way."""
    run = lora_run(trained, pretrained_dir, "fsdp")
    assert_starts_from_checkpoint(run, pretrained_dir)
    for rank in range(WORLD):
        loading = run.probe("loading", rank)
        assert loading["fsdp_plugin"] is True, loading
        assert loading["cpu_ram_efficient_loading"] is True, loading
        # transformers writes "true"; accelerate's plugin rewrites it as str(True).
        assert loading["env_FSDP_CPU_RAM_EFFICIENT_LOADING"].lower() == "true", loading
        assert loading["perturbed"] is (rank != 0), loading
        wrapper = run.probe("wrapper", rank)
        assert wrapper["fsdp_module"] is True and wrapper["param_local_fraction"] == 0.5


@pytest.mark.parametrize("strategy", ["zero3", "fsdp"])
def test_lora_starts_from_model_path(
    trained: Callable[..., Run], pretrained_dir: Path, strategy: str
) -> None:
    from transformers import AutoModelForCausalLM

    run = lora_run(trained, pretrained_dir, strategy)
    # No "eval loss falls" here: 8 LoRA steps on an already trained base move it by ~0.01,
    # too little to be a robust relation; the adapters' change is checked instead.
    assert_starts_from_checkpoint(run, pretrained_dir)
    model_class, wrapped_class = WRAPPED[strategy]
    wrapper = run.probe("wrapper", 0)
    assert wrapper["model_class"] == model_class
    # FSDP2 replaces the module's class in place: there is no separate wrapper object.
    assert wrapper["wrapped_class"] == (None if strategy == "fsdp" else wrapped_class)
    assert_only_adapters_changed(run)  # on each rank's own shard: base frozen
    model_dir = run.run_dir / "model"
    assert (model_dir / "adapter" / "adapter_config.json").is_file()
    assert (model_dir / "adapter" / "adapter_model.safetensors").is_file()
    # The merged model: the checkpoint's weights plus the trained update, no adapters left.
    logits = assert_saved_model_reproduces_logits(run)
    merged = AutoModelForCausalLM.from_pretrained(model_dir)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    before = pretrained_logits(pretrained_dir, run.logits()["input_ids"])
    assert (logits - before).abs().max() > 1e-3
