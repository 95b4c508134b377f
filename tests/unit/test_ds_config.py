"""ds_config: concrete values, DeepSpeed's own parser, the checked-in files, HF's mismatch check."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

from launcher.config.compose import compose_config
from launcher.config.schema import RunConfig
from launcher.engines.deepspeed.ds_config import (
    PRECISIONS,
    build_ds_config,
    deepspeed_strategies,
    reference_config,
)
from launcher.engines.deepspeed.ds_config import main as ds_config_main
from launcher.engines.deepspeed.ops import use_own_build_cache
from launcher.rundir import json_text

DS_CONFIGS = Path(__file__).resolve().parents[2] / "ds_configs"
GPU = ["cluster.gpu=a100-80g", "cluster.gpus_per_node=8"]
ZERO_STRATEGIES = deepspeed_strategies()

# DeepSpeed's documented top-level keys (0.19.8, deepspeed/runtime/config.py and the
# modules it delegates to). DeepSpeed itself ignores any other top-level key silently, so
# the generator's output is checked against this list (test_generator_output_passes_our_check).
ALLOWED_TOP_LEVEL_KEYS: frozenset[str] = frozenset(
    {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "optimizer", "scheduler", "fp16", "bf16", "torch_autocast", "gradient_clipping",
        "zero_optimization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
        "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state",
        "communication_data_type", "seq_parallel_communication_data_type",
        "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op",
        "disable_allgather", "disable_python_gc", "activation_checkpointing", "aio",
        "flops_profiler", "autotuning", "tensorboard", "wandb", "csv_monitor", "comet",
        "comms_logger", "checkpoint", "data_types", "dataloader_drop_last", "data_efficiency",
        "hybrid_engine", "pipeline", "tensor_parallel", "expert_parallel",
        "sequence_parallel_size", "compile", "weight_quantization", "timers", "log_level",
        "bfloat16", "managed_gradient_accumulation", "use_data_before_expert_parallelism",
        "datastates_ckpt",
    }
)  # fmt: skip


def check_ds_config(ds: dict[str, Any]) -> list[str]:
    """What DeepSpeed would silently ignore (unknown top-level keys) or choke on ("auto")."""
    problems = [
        f"ds_config key '{key}' is not a DeepSpeed top-level key (DeepSpeed would silently "
        f"ignore it). Allowed: {', '.join(sorted(ALLOWED_TOP_LEVEL_KEYS))}."
        for key in ds
        if key not in ALLOWED_TOP_LEVEL_KEYS
    ]
    problems += [f"ds_config {path}='auto'" for path in auto_paths(ds, "")]
    return problems


def auto_paths(node: Any, prefix: str) -> list[str]:
    """Dotted paths (list indices as numbers) of every "auto" value."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in auto_paths(v, f"{prefix}{k}.")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in auto_paths(v, f"{prefix}{i}.")]
    return [prefix.rstrip(".")] if node == "auto" else []


def cfg_for(*overrides: str) -> RunConfig:
    return compose_config(list(overrides))


def all_generated() -> list[tuple[str, RunConfig]]:
    """Every reference config, plus a cpu-preset one per ZeRO strategy in fp32 and bf16."""
    cases = [(f"{s}_{p}", reference_config(s, p)) for s in ZERO_STRATEGIES for p in PRECISIONS]
    cases += [
        (f"cpu_{s}_{p}", cfg_for(f"strategy={s}", f"precision={p}", "cluster.gpus_per_node=2"))
        for s in ZERO_STRATEGIES
        for p in ("fp32", "bf16")
    ]
    return cases


@pytest.fixture(scope="module")
def generated() -> list[tuple[str, RunConfig, dict[str, Any]]]:
    return [(name, cfg, build_ds_config(cfg)) for name, cfg in all_generated()]


def auto_values(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in auto_values(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in auto_values(v, f"{path}[{i}]")]
    return [path] if isinstance(node, str) and node.lower() == "auto" else []


# --- the checked-in files -------------------------------------------------------------


def test_checked_in_files_match_the_generator(tmp_path: Path) -> None:
    # The same entry point `make ds-configs` runs, written to a scratch directory.
    assert ds_config_main(["--write-all", str(tmp_path)]) == 0
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.json")}
    assert set(fresh) == {f"{s}_{p}.json" for s in ZERO_STRATEGIES for p in PRECISIONS}
    on_disk = {p.name: p.read_text() for p in DS_CONFIGS.glob("*.json")}
    assert set(on_disk) == set(fresh), (
        f"ds_configs/ has extra or missing files {sorted(set(on_disk) ^ set(fresh))}; "
        "run `make ds-configs`"
    )
    drifted = sorted(name for name in fresh if on_disk[name] != fresh[name])
    assert not drifted, f"ds_configs/{drifted} differ from the generator; run `make ds-configs`"


def test_files_are_stable_json() -> None:
    text = json_text({"b": 1, "a": {"d": 2, "c": 3}})
    assert text == '{\n  "a": {\n    "c": 3,\n    "d": 2\n  },\n  "b": 1\n}\n'


# --- DeepSpeed's own parser -----------------------------------------------------------


@pytest.fixture(scope="module")
def deepspeed_config_cls() -> Any:
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig


def parse_with_deepspeed(cls: Any, ds: dict[str, Any], world_size: int) -> Any:
    """DeepSpeedConfig asks deepspeed.comm for rank and world size; without a process group
    it assumes world size 1 and its batch check fails, so tell it the planned world size."""
    import deepspeed.runtime.config as ds_runtime_config

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ds_runtime_config.dist, "get_rank", lambda group=None: 0)
        mp.setattr(ds_runtime_config.dist, "get_world_size", lambda group=None: world_size)
        return cls(ds)


def test_every_generated_config_passes_deepspeeds_parser(deepspeed_config_cls, generated) -> None:
    assert len(generated) == 25
    for name, cfg, ds in generated:
        parsed = parse_with_deepspeed(deepspeed_config_cls, ds, cfg.world_size)
        assert parsed.world_size == cfg.world_size, name
        assert parsed.zero_optimization_stage == cfg.strategy.zero_stage, name
        assert parsed.train_batch_size == ds["train_batch_size"], name
        # no per-step device sync by DeepSpeed's throughput timer, no progress lines
        assert not parsed.timers_config.enabled and parsed.steps_per_print is None, name
        assert parsed.float16_config.enabled == (cfg.precision.name == "fp16"), name
        assert parsed.bfloat16_config.enabled == (cfg.precision.name == "bf16"), name
        zero = parsed.zero_config
        assert (zero.offload_optimizer is not None) == cfg.strategy.offload_optimizer, name
        assert (zero.offload_param is not None) == cfg.strategy.offload_param, name
        if cfg.strategy.zero_stage == 3:
            assert zero.gather_16bit_weights_on_model_save is True, name
        # The optimizer DeepSpeed will build: on a GPU preset its own AdamW (FusedAdam, or
        # DeepSpeedCPUAdam where offload_optimizer is set: engine.get_optimizer_configuration),
        # with no DeepSpeed scheduler, so the HF Trainer's schedule drives it
        # (test_trainer_runs_deepspeed_adamw_under_the_hf_scheduler runs the offload one);
        # on the cpu preset none, and the Trainer's torch AdamW is allowed.
        assert parsed.scheduler_name is None, name
        if name.startswith("cpu_"):
            assert parsed.optimizer_name is None, name
            assert parsed.zero_allow_untested_optimizer is True, name
            assert parsed.zero_force_ds_cpu_optimizer is False, name
        else:
            train = cfg.train
            assert parsed.optimizer_name == "adamw", name
            assert parsed.optimizer_params == {
                "lr": train.lr, "betas": [train.adam_beta1, train.adam_beta2],
                "eps": train.adam_epsilon, "weight_decay": train.weight_decay}, name
            device = zero.offload_optimizer.device if zero.offload_optimizer else None
            assert device == ("cpu" if cfg.strategy.offload_optimizer else None), name


def test_deepspeeds_parser_rejects_what_we_would_get_wrong(deepspeed_config_cls) -> None:
    """The parser test above can fail: a bad key inside zero_optimization is refused."""
    ds = build_ds_config(reference_config("zero3", "bf16"))
    ds["zero_optimization"]["stage3_prefetch_bucket"] = 1
    with pytest.raises(Exception, match="stage3_prefetch_bucket"):
        parse_with_deepspeed(deepspeed_config_cls, ds, 8)


def test_allowed_top_level_keys_are_deepspeed_keys() -> None:
    import deepspeed
    from deepspeed.runtime.config import _REMOVED_TOP_LEVEL_CONFIG_KEYS

    source = "\n".join(
        p.read_text(errors="ignore") for p in Path(deepspeed.__file__).parent.rglob("*.py")
    )
    quoted = set(re.findall(r"""["']([a-z0-9_]+)["']""", source))
    assert not ALLOWED_TOP_LEVEL_KEYS - quoted
    assert not ALLOWED_TOP_LEVEL_KEYS & set(_REMOVED_TOP_LEVEL_CONFIG_KEYS)


# --- concrete values ------------------------------------------------------------------


def test_no_auto_anywhere(generated) -> None:
    for name, _, ds in generated:
        assert auto_values(ds) == [], name


def test_generator_output_passes_our_check(generated) -> None:
    for name, _, ds in generated:
        assert check_ds_config(ds) == [], name


def test_batch_arithmetic_two_nodes_of_eight() -> None:
    cfg = cfg_for(
        "strategy=zero2", *GPU, "cluster.nodes=2", "train.micro_batch_size=4", "train.grad_accum=8"
    )
    ds = build_ds_config(cfg)
    assert ds["train_batch_size"] == 4 * 8 * 16 == 512
    assert ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 8


def test_tensor_parallel_splits_the_batch_arithmetic_and_gathers_on_save() -> None:
    tp = ["parallel.tp=2", *GPU, "train.micro_batch_size=4", "train.grad_accum=2"]
    zero1 = build_ds_config(cfg_for("strategy=zero1", *tp))
    assert zero1["tensor_parallel"] == {"autotp_size": 2}
    assert "train_batch_size" not in zero1  # DeepSpeed: micro x accum x 4 data-parallel ranks
    assert zero1["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert check_ds_config(zero1) == []
    zero3 = build_ds_config(cfg_for("strategy=zero3", *tp))
    assert "train_batch_size" not in zero3 and zero3["tensor_parallel"] == {"autotp_size": 2}
    assert "tensor_parallel" not in build_ds_config(cfg_for("strategy=zero1", *GPU))


def test_train_values_are_copied() -> None:
    cfg = cfg_for("strategy=zero1", "train.max_grad_norm=0.5", "train.logging_steps=3")
    ds = build_ds_config(cfg)
    assert ds["gradient_clipping"] == 0.5
    assert ds["wall_clock_breakdown"] is False


def test_fp16_is_dynamic_loss_scaling_from_the_precision_group() -> None:
    cfg = cfg_for(
        "strategy=zero2", "precision=fp16", *GPU,
        "precision.initial_scale_power=12", "precision.loss_scale_window=500",
        "precision.hysteresis=3", "precision.min_loss_scale=2",
    )  # fmt: skip
    ds = build_ds_config(cfg)
    assert ds["fp16"] == {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 12,
        "loss_scale_window": 500,
        "hysteresis": 3,
        "min_loss_scale": 2,
    }
    assert ds["bf16"] == {"enabled": False}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fp32_and_bf16_blocks(precision: str) -> None:
    ds = build_ds_config(cfg_for("strategy=zero2", f"precision={precision}"))
    assert ds["fp16"] == {"enabled": False}
    assert ds["bf16"] == {"enabled": precision == "bf16"}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "auto"])
def test_only_deepspeed_strategies_get_a_config(strategy: str) -> None:
    """A caller's bug, not user input: the planner builds a ds_config for DeepSpeed only.
    (Bad strategy.* values are validation's to refuse, see test_validate.py.)"""
    with pytest.raises(ValueError, match="not a DeepSpeed strategy"):
        build_ds_config(cfg_for(f"strategy={strategy}"))


# --- ZeRO blocks ----------------------------------------------------------------------


def test_stage_2_keys_from_hidden_size() -> None:
    zero = build_ds_config(reference_config("zero2", "bf16"))["zero_optimization"]
    assert zero == {
        "stage": 2,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 4096 * 4096,
        "allgather_bucket_size": 4096 * 4096,
        "allgather_partitions": True,
        "reduce_scatter": True,
    }


def test_stage_3_keys_follow_hfs_hidden_size_rules_above_deepspeeds_prefetch_default() -> None:
    """Llama-7B (hidden 4096): HF's rules but for the buckets, whose h*h (16.8M) is below
    the ZeRO-3 floor, DeepSpeed's 5e7 prefetch default (measured 1.6x the tokens/s of h*h
    for a 1.1B model on an H200: bench/results/gpu_ab.json)."""
    zero = build_ds_config(reference_config("zero3", "bf16"))["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["reduce_bucket_size"] == 50_000_000
    assert zero["stage3_prefetch_bucket_size"] == 45_000_000
    assert zero["stage3_param_persistence_threshold"] == 10 * 4096
    assert zero["stage3_max_live_parameters"] == 10**9
    assert zero["stage3_max_reuse_distance"] == 10**9
    assert zero["sub_group_size"] == 10**9
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert "allgather_bucket_size" not in zero and "offload_param" not in zero


def test_buckets_are_never_tinier_than_a_million_elements_or_an_eighth_of_the_model() -> None:
    """HF's h*h rule gives the tiny Llama (h=64) 4096-element buckets: dozens of
    collectives per step. The floor is 2**20 elements, or an eighth of the model if smaller
    (at least 8 buckets, so ZeRO-2 still frees others' gradients during the backward)."""
    from launcher.config.architecture import count_params
    from launcher.engines.deepspeed.ds_config import MIN_BUCKET_ELEMENTS

    tiny = cfg_for("strategy=zero3")
    zero = build_ds_config(tiny)["zero_optimization"]
    eighth = math.ceil(count_params(tiny.model) / 8)
    assert zero["reduce_bucket_size"] == eighth and 64 * 64 < eighth < MIN_BUCKET_ELEMENTS
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * eighth)
    assert zero["stage3_param_persistence_threshold"] == 10 * 64  # still HF's rule
    mid = cfg_for("strategy=zero2", "model.hidden_size=512", "model.num_heads=8",
                  "model.num_kv_heads=8", "model.num_layers=8")
    assert build_ds_config(mid)["zero_optimization"]["reduce_bucket_size"] == MIN_BUCKET_ELEMENTS
    wide = cfg_for("strategy=zero2", "model.hidden_size=2048", "model.num_heads=16",
                   "model.num_kv_heads=16")
    assert build_ds_config(wide)["zero_optimization"]["reduce_bucket_size"] == 2048 * 2048


def test_bucket_size_and_gather_overrides() -> None:
    cfg = cfg_for(
        "strategy=zero3", "strategy.bucket_size=1000000", "strategy.gather_weights_on_save=false"
    )
    zero = build_ds_config(cfg)["zero_optimization"]
    assert zero["reduce_bucket_size"] == 1_000_000
    assert zero["stage3_prefetch_bucket_size"] == 900_000
    assert zero["stage3_gather_16bit_weights_on_model_save"] is False


def test_offload_blocks_pin_memory_only_on_a_real_gpu() -> None:
    gpu2 = build_ds_config(reference_config("zero2_offload", "bf16"))["zero_optimization"]
    assert gpu2["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "offload_param" not in gpu2
    gpu3 = build_ds_config(reference_config("zero3_offload", "bf16"))["zero_optimization"]
    assert gpu3["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert gpu3["offload_param"] == {"device": "cpu", "pin_memory": True}
    cpu3 = build_ds_config(cfg_for("strategy=zero3_offload"))["zero_optimization"]
    assert cpu3["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert cpu3["offload_param"] == {"device": "cpu", "pin_memory": False}


# --- optimizer ------------------------------------------------------------------------


def test_cpu_preset_uses_the_trainers_torch_optimizer() -> None:
    ds = build_ds_config(cfg_for("strategy=zero2_offload"))
    assert "optimizer" not in ds and "scheduler" not in ds
    assert ds["zero_force_ds_cpu_optimizer"] is False


def test_gpu_preset_gets_deepspeed_adamw_from_train_values() -> None:
    cfg = cfg_for(
        "strategy=zero3", *GPU, "train.lr=1e-5", "train.weight_decay=0.1",
        "train.adam_beta2=0.95", "train.adam_epsilon=1e-6",
    )  # fmt: skip
    ds = build_ds_config(cfg)
    assert ds["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1},
    }
    assert "scheduler" not in ds  # the HF Trainer's scheduler drives DeepSpeed's optimizer
    assert "zero_force_ds_cpu_optimizer" not in ds


@pytest.mark.parametrize("strategy", ["zero2", "zero3_offload"])
def test_torch_optimizer_on_a_gpu_preset_needs_no_deepspeed_op(strategy: str) -> None:
    """train.optimizer=torch: the Trainer's torch AdamW (fused on GPUs) under DeepSpeed, so
    no FusedAdam / DeepSpeedCPUAdam is JIT-compiled (no nvcc needed)."""
    ds = build_ds_config(cfg_for(f"strategy={strategy}", *GPU, "train.optimizer=torch"))
    assert "optimizer" not in ds and "scheduler" not in ds
    assert ds["zero_force_ds_cpu_optimizer"] is False
    assert ds["zero_allow_untested_optimizer"] is True
    assert check_ds_config(ds) == []
    # Everything else is what the default (DeepSpeed's AdamW) run gets.
    default = build_ds_config(cfg_for(f"strategy={strategy}", *GPU))
    assert {k: v for k, v in default.items() if k != "optimizer"} == {
        k: v for k, v in ds.items()
        if k not in ("zero_force_ds_cpu_optimizer", "zero_allow_untested_optimizer")
    }  # fmt: skip


# --- the generator's self-check -----------------------------------------------------


def test_check_rejects_unknown_top_level_key() -> None:
    ds = build_ds_config(reference_config("zero2", "bf16"))
    ds["zero_optimisation"] = {"stage": 3}
    message = "\n".join(check_ds_config(ds))
    assert "'zero_optimisation'" in message
    assert "zero_optimization" in message and "train_batch_size" in message  # allowed list


def test_check_rejects_auto_and_names_its_path() -> None:
    ds = build_ds_config(reference_config("zero3", "bf16"))
    ds["zero_optimization"]["reduce_bucket_size"] = "auto"
    ds["optimizer"]["params"]["betas"] = ["auto", 0.999]
    message = "\n".join(check_ds_config(ds))
    assert "zero_optimization.reduce_bucket_size" in message
    assert "optimizer.params.betas.0" in message


# --- the HF Trainer's mismatch check (transformers/integrations/deepspeed.py) ---------


@pytest.fixture
def clean_hf_state():
    """TrainingArguments(deepspeed=...) sets a global HfDeepSpeedConfig and accelerate's
    PartialState; undo both so later tests do not see ZeRO-3 or a stale state."""
    saved_env = dict(os.environ)
    yield
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ.clear()
    os.environ.update(saved_env)


def training_args(tmp_path: Path, ds: dict[str, Any], cfg: RunConfig, **changes: Any) -> Any:
    from transformers import TrainingArguments

    train = cfg.train
    kwargs = dict(
        learning_rate=train.lr, weight_decay=train.weight_decay, adam_beta1=train.adam_beta1,
        adam_beta2=train.adam_beta2, adam_epsilon=train.adam_epsilon,
        max_grad_norm=train.max_grad_norm, per_device_train_batch_size=train.micro_batch_size,
        gradient_accumulation_steps=train.grad_accum,
    )  # fmt: skip
    kwargs.update(changes)
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, deepspeed=ds, **kwargs)


@pytest.mark.usefixtures("clean_hf_state")
def test_hf_mismatch_check_agrees_with_the_same_run_config(tmp_path: Path) -> None:
    # One process here, so a world of one GPU; the optimizer block is the GPU-preset one.
    cfg = cfg_for(
        "strategy=zero3_offload", "cluster.gpu=a100-80g", "cluster.gpus_per_node=1",
        "train.lr=3e-5", "train.weight_decay=0.1", "train.micro_batch_size=2",
        "train.grad_accum=4",
    )  # fmt: skip
    ds = build_ds_config(cfg)
    args = training_args(tmp_path, ds, cfg)
    hf_config = args.hf_deepspeed_config
    hf_config.trainer_config_finalize(args, None, 100)  # raises on any mismatch
    assert hf_config.config["train_batch_size"] == 8
    assert hf_config.config["optimizer"] == ds["optimizer"]

    args = training_args(tmp_path, ds, cfg, learning_rate=1e-4, adam_beta2=0.95)
    with pytest.raises(ValueError) as error:
        args.hf_deepspeed_config.trainer_config_finalize(args, None, 100)
    assert "optimizer.params.lr=3e-05 vs hf learning_rate=0.0001" in str(error.value)
    assert "optimizer.params.betas" in str(error.value)


# --- a real Trainer run: DeepSpeed's optimizer driven by the HF scheduler -------------

TRAINER_RUN = r"""
import json, os, sys, tempfile
import torch
from launcher.config.compose import compose_config
from launcher.engines.deepspeed.ds_config import build_ds_config

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0", ACCELERATE_USE_DEEPSPEED="true")
cfg = compose_config([f"strategy={sys.argv[1]}", "cluster.gpu=a100-80g",
                      "cluster.gpus_per_node=1", "train.lr=1e-3", "train.weight_decay=0.01"])
from launcher.rank.imports import import_stack

from launcher.engines import engine_of

import_stack(cfg, engine_of(cfg.strategy))  # a rank's imports
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

t, m = cfg.train, cfg.model
args = TrainingArguments(
    output_dir=tempfile.mkdtemp(), use_cpu=True, deepspeed=build_ds_config(cfg),
    learning_rate=t.lr, weight_decay=t.weight_decay, adam_beta1=t.adam_beta1,
    adam_beta2=t.adam_beta2, adam_epsilon=t.adam_epsilon, max_grad_norm=t.max_grad_norm,
    per_device_train_batch_size=t.micro_batch_size, gradient_accumulation_steps=t.grad_accum,
    max_steps=6, lr_scheduler_type="cosine", warmup_steps=2, logging_steps=1,
    save_strategy="no")
model = LlamaForCausalLM(LlamaConfig(
    hidden_size=m.hidden_size, num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
    num_key_value_heads=m.num_kv_heads, intermediate_size=m.intermediate_size,
    vocab_size=m.vocab_size, max_position_embeddings=m.max_position_embeddings))
g = torch.Generator().manual_seed(0)
data = [{"input_ids": ids, "labels": ids.clone()}
        for ids in torch.randint(0, m.vocab_size, (8, 32), generator=g)]
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
engine = trainer.model_wrapped
print(json.dumps({
    "engine": type(engine).__name__,
    "optimizer": type(engine.optimizer.optimizer).__name__,
    "lrs": [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h],
}))
"""


@pytest.mark.slow
def test_trainer_runs_deepspeed_adamw_under_the_hf_scheduler() -> None:
    """The GPU-preset file (optimizer block, no scheduler block) through the real Trainer on
    one CPU process: HF's mismatch check passes, DeepSpeed builds its own Adam (compiled
    with ninja on a fresh machine, ~40-80 s), and the lr follows HF's warmup + cosine.

    One case, zero2_offload: DeepSpeedCPUAdam is also the op GPU runs with offload use.
    The zero2 file differs only in having no offload_optimizer block, which
    test_every_generated_config_passes_deepspeeds_parser checks; the FusedAdam DeepSpeed
    then builds on CPU is a CPU-only op (a second compile), not the CUDA one GPUs run."""
    strategy, optimizer = "zero2_offload", "DeepSpeedCPUAdam"
    import json
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:  # a free port for this one-process group
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    # The ops where a rank finds them: the environment's own build cache and ninja, which
    # `make ops` filled (else this test builds them, ~1 min).
    env = dict(os.environ)
    use_own_build_cache(env)
    run = subprocess.run(
        [sys.executable, "-c", TRAINER_RUN, strategy, port], env=env,
        capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["engine"] == "DeepSpeedEngine"
    assert result["optimizer"] == optimizer
    # warmup 2 then cosine over 4 steps: peak 1e-3, then 1e-3 * (1 + cos(pi * k / 4)) / 2
    for expected in (1e-3, 8.53553391e-4, 5e-4, 1.46446609e-4):
        assert any(abs(lr - expected) < 1e-12 for lr in result["lrs"]), (expected, result)


def test_building_configs_imports_no_heavy_library() -> None:
    """`ftl plan` / `ftl ds-config` must answer without torch, transformers or deepspeed."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from launcher.config.compose import compose_config\n"
        "from launcher.engines.deepspeed.ds_config import build_ds_config\n"
        "from launcher.engines.fsdp.settings import build_fsdp_settings\n"
        "build_ds_config(compose_config(['strategy=zero3_offload']))\n"
        "build_fsdp_settings(compose_config(['strategy=fsdp_offload']))\n"
        "print(sorted({'torch', 'transformers', 'deepspeed', 'accelerate'} & set(sys.modules)))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
