"""Every strategy, really trained: 2 CPU ranks over gloo, the tiny Llama, 8 optimizer steps.

Each run must show, from what the ranks themselves recorded (result.json):
- 2 processes in the Trainer's world and data sharded between them,
- the strategy's wrapper really applied (engine ZeRO stage, FSDP2 class, offload),
- train and eval loss going down,
- a saved model/ that from_pretrained loads and whose logits on a fixed batch equal the
  trained model's (recorded by the ranks before saving).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from runs import Run, describe_failure

from launcher.checkpoints import is_complete, list_checkpoints

pytestmark = pytest.mark.slow

MICRO_BATCH, MAX_STEPS, WORLD = 4, 8, 2

# What result.json's "wrapper" must contain for each strategy.
EXPECTED_WRAPPER: dict[str, dict[str, Any]] = {
    "ddp": {"wrapped_class": "DistributedDataParallel", "model_class": "LlamaForCausalLM"},
    "zero1": {
        "wrapped_class": "DeepSpeedEngine",
        "zero_stage": 1,
        "zero_optimizer_class": "DeepSpeedZeroOptimizer",
        "offload_optimizer_device": None,
        "zero_optimizer_offloads": False,
    },
    "zero2": {
        "wrapped_class": "DeepSpeedEngine",
        "zero_stage": 2,
        "zero_optimizer_class": "DeepSpeedZeroOptimizer",
        "offload_optimizer_device": None,
        "zero_optimizer_offloads": False,
    },
    "zero2_offload": {
        "wrapped_class": "DeepSpeedEngine",
        "zero_stage": 2,
        "offload_optimizer_device": "cpu",
        "zero_optimizer_offloads": True,
    },
    "zero3": {
        "wrapped_class": "DeepSpeedEngine",
        "zero_stage": 3,
        "zero_optimizer_class": "DeepSpeedZeroOptimizer_Stage3",
        "offload_optimizer_device": None,
        "offload_param_device": None,
        "param_local_fraction": 0.5,
    },
    "zero3_offload": {
        "wrapped_class": "DeepSpeedEngine",
        "zero_stage": 3,
        "zero_optimizer_class": "DeepSpeedZeroOptimizer_Stage3",
        "offload_optimizer_device": "cpu",
        "offload_param_device": "cpu",
        "zero_optimizer_offloads": True,
        "param_local_fraction": 0.5,
    },
    "fsdp": {
        "model_class": "FSDPLlamaForCausalLM",
        "fsdp_module": True,
        "param_class": "DTensor",
        "param_local_fraction": 0.5,
        "offload_policies": ["OffloadPolicy"],
    },
    "fsdp_offload": {
        "model_class": "FSDPLlamaForCausalLM",
        "fsdp_module": True,
        "param_class": "DTensor",
        "param_local_fraction": 0.5,
        "offload_policies": ["CPUOffloadPolicy"],
    },
}

ZERO = ["zero1", "zero2", "zero2_offload", "zero3", "zero3_offload"]
NO_GATHER = ("strategy.gather_weights_on_save=false",)  # ZeRO-3 shards -> zero_to_fp32
CASES: list[tuple[str, str, str, tuple[str, ...]]] = [
    *[(s, "torchrun", "fp32", ()) for s in EXPECTED_WRAPPER],
    *[(s, "deepspeed", "fp32", ()) for s in ZERO],
    ("ddp", "torchrun", "bf16", ()),
    ("zero3", "deepspeed", "bf16", ()),
    ("fsdp", "torchrun", "bf16", ()),
    ("zero3", "torchrun", "fp32", NO_GATHER),
]


def run_name(strategy: str, launcher: str, precision: str, extra: tuple[str, ...] = ()) -> str:
    tags = [e.split(".")[-1].replace("=", "-") for e in extra]
    return "-".join([strategy, launcher, precision, *tags])


def strategy_overrides(
    strategy: str, launcher: str, precision: str, extra: tuple[str, ...] = ()
) -> list[str]:
    return [
        f"strategy={strategy}",
        f"cluster.launcher={launcher}",
        f"precision={precision}",
        *extra,
    ]


@pytest.mark.parametrize(
    ("strategy", "launcher", "precision", "extra"), CASES, ids=[run_name(*c) for c in CASES]
)
def test_strategy_trains_sharded_and_saves_a_loadable_model(
    trained: Callable[..., Run],
    strategy: str,
    launcher: str,
    precision: str,
    extra: tuple[str, ...],
) -> None:
    run = trained(
        run_name(strategy, launcher, precision, extra),
        strategy_overrides(strategy, launcher, precision, extra),
    )
    assert run.returncode == 0, describe_failure(run)
    result = run.result

    assert result["world_size"] == WORLD
    assert result["process_group_size"] == WORLD
    assert result["num_processes"] == WORLD
    assert_data_sharded(result["data"])
    assert_wrapper(result["wrapper"], strategy)
    assert result["global_step"] == MAX_STEPS
    assert_loss_decreased(result)
    assert_precision(result, strategy, precision)
    assert_checkpoints_complete(run)
    assert_metrics_logged(run)
    assert_saved_model_reproduces_logits(run, precision)


def assert_data_sharded(data: dict[str, Any]) -> None:
    """Each rank loaded its own samples (no overlap) and iterates half the epoch."""
    assert data["samples_seen_by_several_ranks"] == 0, data
    assert len(data["samples_per_rank"]) == WORLD
    for count in data["unique_samples_per_rank"]:
        assert count >= MAX_STEPS * MICRO_BATCH, data
    expected_batches = math.ceil(data["dataset_size"] / (MICRO_BATCH * WORLD))
    assert data["batches_per_epoch_per_rank"] == [expected_batches] * WORLD, data


def assert_wrapper(wrapper: dict[str, Any], strategy: str) -> None:
    for key, value in EXPECTED_WRAPPER[strategy].items():
        assert wrapper.get(key) == value, f"{key}: {wrapper}"


def assert_loss_decreased(result: dict[str, Any]) -> None:
    # 8 steps at lr 3e-3 take the tiny model from ~6.2 (uniform over 512 tokens) to ~4.8.
    assert result["final_train_loss"] < result["first_train_loss"] - 0.5, result
    assert result["final_eval_loss"] < result["initial_eval_loss"] - 0.5, result


def assert_precision(result: dict[str, Any], strategy: str, precision: str) -> None:
    if strategy.startswith("zero"):
        expected = "torch.bfloat16" if precision == "bf16" else "torch.float32"
        assert result["wrapper"]["engine_dtype"] == expected, result["wrapper"]
        assert result["dtype"] == expected, result
    if precision == "bf16" and strategy == "ddp":
        # Autocast: fp32 master weights; bf16 shows in the losses (checked against fp32 below).
        assert result["dtype"] == "torch.float32"


def assert_checkpoints_complete(run: Run) -> None:
    checkpoints = list_checkpoints(run.run_dir / "checkpoints")
    assert [c.name for c in checkpoints] == ["checkpoint-4", "checkpoint-8"]
    assert all(is_complete(c) for c in checkpoints)


def assert_metrics_logged(run: Run) -> None:
    """metrics.jsonl: every step's loss, the initial and final eval, throughput, memory."""
    metrics = run.metrics()
    assert sorted(run.train_losses()) == list(range(1, MAX_STEPS + 1))
    assert [m["step"] for m in metrics if "eval_loss" in m] == [0, MAX_STEPS]
    assert all(m["peak_memory_mib"] > 0 for m in metrics)
    assert any(m.get("tokens_per_s", 0) > 0 for m in metrics)


def assert_saved_model_reproduces_logits(run: Run, precision: str) -> None:
    from transformers import AutoModelForCausalLM

    recorded = torch.load(run.run_dir / "final_logits.pt")
    model = AutoModelForCausalLM.from_pretrained(run.run_dir / "model")
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=recorded["input_ids"]).logits.float()
    trained_logits = recorded["logits"]
    assert logits.shape == trained_logits.shape
    # fp32: the same weights give the same numbers. bf16: FSDP computes in bf16 but saves
    # fp32 weights, so the two forwards differ by bf16 rounding.
    atol = 1e-4 if precision == "fp32" else 0.1
    assert torch.allclose(logits, trained_logits, atol=atol), (
        (logits - trained_logits).abs().max().item()
    )
    # A model that did not train (or loaded the initial weights) is far from these.
    assert trained_logits.abs().max() > 0.5


def test_bf16_losses_track_fp32(trained: Callable[..., Run]) -> None:
    """bf16 really ran (losses not bit-identical to fp32) and trains the same way."""
    fp32 = trained(
        run_name("ddp", "torchrun", "fp32"), strategy_overrides("ddp", "torchrun", "fp32")
    )
    bf16 = trained(
        run_name("ddp", "torchrun", "bf16"), strategy_overrides("ddp", "torchrun", "bf16")
    )
    assert fp32.returncode == 0 and bf16.returncode == 0
    a, b = fp32.train_losses(), bf16.train_losses()
    assert a.keys() == b.keys()
    assert a != b
    assert all(abs(a[k] - b[k]) < 0.1 for k in a), (a, b)


def test_activation_checkpointing_is_applied_and_changes_no_numbers(
    trained: Callable[..., Run],
) -> None:
    plain = trained(
        run_name("ddp", "torchrun", "fp32"), strategy_overrides("ddp", "torchrun", "fp32")
    )
    checkpointed = trained(
        "ddp-torchrun-fp32-activation-checkpointing",
        [*strategy_overrides("ddp", "torchrun", "fp32"), "train.gradient_checkpointing=true"],
    )
    assert checkpointed.returncode == 0, describe_failure(checkpointed)
    assert checkpointed.result["activation_checkpointing"] is True
    assert plain.result["activation_checkpointing"] is False
    # Recomputing activations in backward gives the same gradients, so the same losses.
    assert checkpointed.train_losses() == pytest.approx(plain.train_losses(), rel=1e-5)
