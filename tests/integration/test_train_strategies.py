"""Every strategy, really trained: 2 CPU ranks over gloo, the tiny Llama (the tiny MoE for
zero3 and fsdp: MOE_RUNS), 8 optimizer steps.

Each run must show, from what injected probes measured on the ranks (tests/integration/
probes.py) and what the run dir holds:
- 2 processes and data sharded between them (disjoint rows, half the batches per epoch),
- the strategy's wrapper really applied (ZeRO stage read from the optimizer object, FSDP2
  class and shards, offload), and for ddp/zero1/zero2/zero3/fsdp the partitioning itself
  in measured per-rank optimizer-state and gradient bytes,
- the precision really used (a bf16 run computes its linear layers in bf16),
- train and eval loss going down, every step logged once, complete checkpoints,
- a saved model/ that from_pretrained loads and whose logits on a fixed batch equal the
  trained model's (recorded by a probe before saving),
- on the MoE runs, the router's aux_loss logged with every training loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from runs import (
    EVIDENCE,
    MIXTURE,
    MOE,
    Run,
    assert_router_loss_logged,
    callbacks,
    describe_failure,
)

from launcher.config.schema import TrainConfig
from launcher.data.preprocess import read_prepared
from launcher.rank.watchdog import collective_timeout_s
from launcher.rundir import RunDir
from launcher.rundir.checkpoints import is_complete, list_checkpoints

pytestmark = pytest.mark.slow

MICRO_BATCH, MAX_STEPS, WORLD = 4, 8, 2

# Under DeepSpeed: its engine, the node's two ranks counted (LOCAL_SIZE on CPU), and its
# own process group under the run's collective timeout (not torch's default for a new group).
TRAIN = TrainConfig()
ZERO = {"wrapped_class": "DeepSpeedEngine", "local_device_count": WORLD,
        "dp_group_timeout_s": collective_timeout_s(TRAIN.hang_timeout_s,
                                                   TRAIN.first_step_timeout_s)}
# What the WrapperProbe must find for each strategy.
EXPECTED_WRAPPER: dict[str, dict[str, Any]] = {
    "ddp": {"wrapped_class": "DistributedDataParallel", "model_class": "LlamaForCausalLM"},
    "zero1": {**ZERO, "zero_stage": 1,
              "zero_optimizer_class": "DeepSpeedZeroOptimizer", "offload_optimizer": False},
    "zero2": {**ZERO, "zero_stage": 2,
              "zero_optimizer_class": "DeepSpeedZeroOptimizer", "offload_optimizer": False},
    "zero2_offload": {**ZERO, "zero_stage": 2,
                      "offload_optimizer": True},
    "zero3": {**ZERO, "zero_stage": 3,
              "zero_optimizer_class": "DeepSpeedZeroOptimizer_Stage3",
              "offload_optimizer": False, "offload_param": False,
              "param_local_fraction": 0.5},
    "zero3_offload": {**ZERO, "zero_stage": 3,
                      "zero_optimizer_class": "DeepSpeedZeroOptimizer_Stage3",
                      "offload_optimizer": True, "offload_param": True,
                      "param_local_fraction": 0.5},
    "fsdp": {"model_class": "FSDPLlamaForCausalLM", "fsdp_module": True,
             "param_class": "DTensor", "param_local_fraction": 0.5,
             "offload_policies": ["OffloadPolicy"]},
    "fsdp_offload": {"model_class": "FSDPLlamaForCausalLM", "fsdp_module": True,
                     "param_class": "DTensor", "param_local_fraction": 0.5,
                     "offload_policies": ["CPUOffloadPolicy"]},
}


def run_name(strategy: str, launcher: str, precision: str, extra: tuple[str, ...] = ()) -> str:
    tags = [e.split(".")[-1].replace("=", "-") for e in extra]
    return "-".join([strategy, launcher, precision, *tags])


NO_GATHER = ("strategy.gather_weights_on_save=false",)  # ZeRO-3: zero_to_fp32; FSDP: sharded
FULL = pytest.mark.full
"""`make test-full` only: a case whose code paths the `make test` cases already run."""


def case(strategy: str, launcher: str, precision: str, extra: tuple[str, ...] = (),
         full: bool = False) -> Any:
    return pytest.param(strategy, launcher, precision, extra, marks=[FULL] if full else [],
                        id=run_name(strategy, launcher, precision, extra))


# Every strategy once (in `make test` all but zero1, zero2_offload and fsdp_offload, whose
# code paths other runs take, as their comments say), each launcher (`make test-full`: twice), each
# precision under each backend, and each save path: gathered weights, ZeRO-3's
# zero_to_fp32 and FSDP's sharded checkpoints (on the offload variants: the save path does
# not touch their training). The deepspeed launcher costs ~6 s more per run than torchrun
# (its runner imports DeepSpeed before the ranks start): `make test` runs it once here (the
# zero2 run, also the reference of test_graceful_stop.py's zero2 stop by a kill -9 of `ftl
# train`, which launches it twice more) and in test_slurm.py's two-node job.
CASES = [
    case("ddp", "torchrun", "fp32"),
    # zero1 trains, saves and resumes in test_tensor_parallel.py (zero1 with parallel.tp=2)
    case("zero1", "torchrun", "fp32", full=True),
    case("zero2", "deepspeed", "fp32"),
    # optimizer offload's training is zero3_offload's too (its wrapper: offload_optimizer)
    case("zero2_offload", "torchrun", "fp32", full=True),
    case("zero3", "torchrun", "fp32"),
    case("zero3_offload", "torchrun", "fp32", NO_GATHER),
    case("fsdp", "torchrun", "fp32"),
    # FSDP's offload is a flag of the same wrapping (fsdp's runs here and in
    # test_graceful_stop.py); offloaded parameters train in zero3_offload's run
    case("fsdp_offload", "torchrun", "fp32", NO_GATHER, full=True),
    case("ddp", "torchrun", "bf16"),
    case("zero3", "torchrun", "bf16"),
    case("fsdp", "torchrun", "bf16"),
    # every other launcher x strategy pair, and the save paths on the plain strategies
    case("zero1", "deepspeed", "fp32", full=True),
    case("zero2", "torchrun", "fp32", full=True),
    case("zero2_offload", "deepspeed", "fp32", full=True),
    case("zero3", "deepspeed", "fp32", full=True),
    case("zero3", "deepspeed", "bf16", full=True),
    case("zero3_offload", "deepspeed", "fp32", NO_GATHER, full=True),
    case("zero3_offload", "torchrun", "fp32", full=True),
    case("zero3", "torchrun", "fp32", NO_GATHER, full=True),
    case("fsdp", "torchrun", "fp32", NO_GATHER, full=True),
    case("fsdp_offload", "torchrun", "fp32", full=True),
]


MOE_RUNS = {("zero3", "torchrun", "fp32"), ("fsdp", "torchrun", "fp32")}
"""The runs that train the tiny mixture of experts (configs/model/tiny-moe.yaml) instead
of the tiny Llama, and so every test that resumes them or starts from their checkpoints:
test_graceful_stop.py's zero3 and fsdp stops, test_world_size_change.py's zero3 and fsdp
chains (ddp's MoE run is test_chaos.py's). Only the plain SFT runs, whatever their save
path: DPO and LoRA runs of the same strategy keep the Llama."""


def model_overrides(strategy: str, launcher: str, precision: str,
                    extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """MOE for a run MOE_RUNS names, else nothing (the default tiny Llama)."""
    plain = set(extra) <= set(NO_GATHER)
    return MOE if plain and (strategy, launcher, precision) in MOE_RUNS else ()


MIXTURE_RUNS = {("zero3_offload", "torchrun", "fp32")}
"""The runs that train on the mixture preset (configs/dataset/mix.yaml: three sources drawn
by weight) instead of the bundled sums: the reference of test_sequence_parallel.py's
chain, which trains on it too, so that the mixture trains, stops and resumes exactly."""


def data_overrides(strategy: str, launcher: str, precision: str,
                   extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """MIXTURE for a run MIXTURE_RUNS names, else nothing (the default data)."""
    plain = set(extra) <= set(NO_GATHER)
    return MIXTURE if plain and (strategy, launcher, precision) in MIXTURE_RUNS else ()


def strategy_overrides(
    strategy: str, launcher: str, precision: str, extra: tuple[str, ...] = ()
) -> list[str]:
    return [
        f"strategy={strategy}",
        f"cluster.launcher={launcher}",
        f"precision={precision}",
        callbacks(*EVIDENCE),
        *model_overrides(strategy, launcher, precision, extra),
        *data_overrides(strategy, launcher, precision, extra),
        *extra,
    ]


@pytest.mark.parametrize(("strategy", "launcher", "precision", "extra"), CASES)
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

    assert result["world_size"] == WORLD and result["global_step"] == MAX_STEPS
    assert_data_sharded(run)
    moe = bool(model_overrides(strategy, launcher, precision, extra))
    assert_wrapper(run, strategy, moe)
    if precision == "fp32" and strategy in PARTITION_CHECKS:
        PARTITION_CHECKS[strategy]([run.probe("partition", r) for r in range(WORLD)])
    assert_precision(run, precision)
    assert_loss_decreased(result)
    assert_checkpoints_complete(run, sharded_fsdp=strategy.startswith("fsdp") and bool(extra))
    assert_metrics_logged(run)
    if moe:
        assert_router_loss_logged(run.run_dir)
    assert_saved_model_reproduces_logits(run, precision)
    if launcher == "deepspeed":
        # DeepSpeed's CPU all-reduce makes a ~66 MB /dev/shm segment per rank and never
        # removes it (DeepSpeedEngine.release_rank does): RAM that piled up run
        # after run. The deepspeed launcher sets the LOCAL_SIZE that turns that path on.
        assert run.shm_left == set(), run.shm_left


def assert_data_sharded(run: Run) -> None:
    """Each rank's model received its own rows (none seen by both) and the rank iterates
    half an epoch's batches."""
    probes = [run.probe("sharding", rank) for rank in range(WORLD)]
    rows = [probe["rows"] for probe in probes]
    assert [len(r) for r in rows] == [MAX_STEPS * MICRO_BATCH] * WORLD
    assert not set(rows[0]) & set(rows[1]), "a row was trained on by both ranks"
    data_dir = RunDir(run.run_dir).read_plan().data_dir  # the sums, or the mixture's draw
    prepared = read_prepared(Path(data_dir)) if data_dir else None
    assert prepared is not None
    expected_batches = math.ceil(prepared.rows / (MICRO_BATCH * WORLD))
    assert [p["batches_per_epoch"] for p in probes] == [expected_batches] * WORLD


def assert_wrapper(run: Run, strategy: str, moe: bool = False) -> None:
    expected = EXPECTED_WRAPPER[strategy]
    if moe:  # the tiny MoE's HF class in place of Llama's
        expected = {k: v.replace("Llama", "Qwen3Moe") if k == "model_class" else v
                    for k, v in expected.items()}
    for rank in range(WORLD):
        wrapper = run.probe("wrapper", rank)
        for key, value in expected.items():
            assert wrapper.get(key) == value, f"rank {rank} {key}: {wrapper}"


def _ddp_partition(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        full = 4 * rank["param_count"]  # fp32 bytes of every trainable parameter
        assert rank["optimizer_state_bytes"] == 2 * full  # Adam m and v of everything
        assert rank["grad_bytes_peak"] == full and rank["step_grad_bytes"] == full


def _zero_optimizer_partitioned(rank: dict[str, Any]) -> int:
    full = 4 * rank["param_count"]
    assert rank["optimizer_state_bytes"] <= 0.55 * 2 * full, rank  # about half of Adam
    assert rank["step_grad_bytes"] <= 0.55 * full, rank  # the fp32 grad partition
    return full


def _zero1_partition(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        full = _zero_optimizer_partitioned(rank)
        assert rank["grad_bytes_peak"] == full, rank  # stage 1 keeps every gradient


def _zero2_partition(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        full = _zero_optimizer_partitioned(rank)
        assert rank["grad_bytes_peak"] <= 0.75 * full, rank  # others' grads freed in backward


def _sharded_params_partition(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        full = _zero_optimizer_partitioned(rank)
        assert rank["param_bytes_local"] <= 0.55 * full, rank  # parameters sharded too


PARTITION_CHECKS: dict[str, Callable[[list[dict[str, Any]]], None]] = {
    "ddp": _ddp_partition,
    "zero1": _zero1_partition,
    "zero2": _zero2_partition,
    "zero3": _sharded_params_partition,
    "fsdp": _sharded_params_partition,
}


def assert_precision(run: Run, precision: str) -> None:
    """The decoder's linear layers really computed in the run's precision."""
    expected = "torch.bfloat16" if precision == "bf16" else "torch.float32"
    for rank in range(WORLD):
        assert run.probe("precision", rank)["output_dtype"] == expected


def assert_loss_decreased(result: dict[str, Any]) -> None:
    # 8 steps at lr 3e-3 take the tiny model from ~6.2 (uniform over 512 tokens) to ~4.8.
    assert result["final_train_loss"] < result["first_train_loss"] - 0.5, result
    assert result["final_eval_loss"] < result["first_eval_loss"] - 0.5, result


def assert_checkpoints_complete(run: Run, sharded_fsdp: bool) -> None:
    checkpoints = list_checkpoints(run.run_dir / "checkpoints")
    assert [c.name for c in checkpoints] == ["checkpoint-4", "checkpoint-8"]
    assert all(is_complete(c) for c in checkpoints)
    if sharded_fsdp:  # torch.distributed.checkpoint: one model shard file per rank
        model_shards = checkpoints[0] / "pytorch_model_fsdp_0"
        assert len(list(model_shards.glob("*.distcp"))) == WORLD
        assert not list(checkpoints[0].glob("*.safetensors"))  # nothing gathered


def assert_metrics_logged(run: Run) -> None:
    """metrics.jsonl: every step's loss once, the initial and final eval, throughput."""
    metrics = run.metrics()
    assert sorted(run.train_losses()) == list(range(1, MAX_STEPS + 1))
    assert [m["step"] for m in metrics if "eval_loss" in m] == [0, MAX_STEPS]
    assert all(m["peak_memory_mib"] > 0 and m["launch"] == 0 for m in metrics)
    assert any(m.get("tokens_per_s", 0) > 0 for m in metrics)


def assert_saved_model_reproduces_logits(run: Run, precision: str) -> Any:
    """model/ loads and reproduces the logits LogitsProbe recorded; returns the model."""
    from transformers import AutoModelForCausalLM

    recorded = run.logits()
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
    return model


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
