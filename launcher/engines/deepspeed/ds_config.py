"""DeepSpeed config: one concrete JSON dict per RunConfig, never "auto", built from the same
RunConfig as the TrainingArguments: the file is complete and usable outside the Trainer, and
the Trainer's mismatch check (below) confirms both agree. Pure: `ftl plan` and `ftl ds-config`
use it.

What the HF integration does with these values (read in transformers 5.24,
transformers/integrations/deepspeed.py, and checked by tests/unit/test_ds_config.py):

- `HfTrainerDeepSpeedConfig.trainer_config_process` calls `fill_match` for
  train_micro_batch_size_per_gpu, gradient_accumulation_steps, train_batch_size
  (= args.world_size x micro x accumulation), gradient_clipping, optimizer.params.lr,
  optimizer.params.betas (compared as the list [adam_beta1, adam_beta2]),
  optimizer.params.eps, optimizer.params.weight_decay, fp16.enabled and bf16.enabled.
  A value that is not "auto" and differs from TrainingArguments is collected as a
  mismatch; `trainer_config_finalize` (called from `deepspeed_init`) raises ValueError
  listing them all. So the worker must pass learning_rate=train.lr,
  adam_beta1/2, adam_epsilon, weight_decay, max_grad_norm, per_device_train_batch_size
  and gradient_accumulation_steps from the same RunConfig.
- `deepspeed_optim_sched` supports "HF scheduler + DS optimizer": with an "optimizer"
  block and no "scheduler" block it builds a DummyOptim and a DummyScheduler whose
  callable is the Trainer's own `create_scheduler` (lr_scheduler_type, warmup), so the
  DeepSpeed optimizer (FusedAdam, or DeepSpeedCPUAdam under offload_optimizer) is driven
  by the HF cosine/linear schedule. With no "optimizer" block it uses the Trainer's
  torch AdamW and sets zero_allow_untested_optimizer itself.
- The hidden-size "auto" rules (reduce_bucket_size = h*h, stage3_prefetch_bucket_size =
  int(0.9*h*h), stage3_param_persistence_threshold = 10*h) are reproduced here, with a
  floor (bucket_elements).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from launcher.config.architecture import count_params
from launcher.config.compose import compose_config
from launcher.config.hardware import gpu_preset
from launcher.config.schema import PrecisionConfig, RunConfig
from launcher.config.strategies import concrete_strategies
from launcher.rundir import json_text

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
MIN_BUCKET_ELEMENTS = 2**20
"""The smallest ZeRO bucket written (4 MiB in fp32) unless an eighth of the model is smaller."""
MIN_STAGE3_BUCKET_ELEMENTS = 50_000_000
"""ZeRO-3's floor instead: DeepSpeed's own stage3_prefetch_bucket_size default. With HF's
h x h (4.2M elements at hidden 2048) a 1.1B Llama on an H200 ran at 14.5 % MFU, with this
floor at 23.5 % (bench/results/gpu_ab.json); ZeRO-2 ran the same with either."""
MIN_BUCKETS = 8
"""A model is reduced in at least this many buckets, so stage 2 still frees the gradients
other ranks own during the backward (one bucket would hold every gradient until the end)."""
OPTIMIZERS: tuple[str, ...] = ("auto", "torch")
"""train.optimizer: see launcher/config/schema.py (checked by launcher/validation/rules.py)."""

# DeepSpeed's own defaults for the stage-3 limits (runtime/zero/config.py), written out.
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
SUB_GROUP_SIZE = 1_000_000_000


def build_ds_config(cfg: RunConfig) -> dict[str, Any]:
    """The complete DeepSpeed config for a validated `cfg`: what it says is written as is
    (only a DeepSpeed strategy has one: anything else is a caller's bug)."""
    if cfg.strategy.backend != "deepspeed":
        raise ValueError(
            f"build_ds_config: strategy={cfg.strategy.name} (backend {cfg.strategy.backend}) "
            "is not a DeepSpeed strategy; resolve strategy=auto and check the backend first"
        )
    train = cfg.train
    ds: dict[str, Any] = {
        "train_batch_size": train.micro_batch_size * train.grad_accum * cfg.world_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "gradient_clipping": train.max_grad_norm,
        "wall_clock_breakdown": False,
        # No DeepSpeed progress line (steps_per_print left out) and no throughput timer: ftl
        # logs lr, loss, tokens/s and MFU itself, and the timer synchronizes the device at
        # the start and end of every step (on by default): two host syncs a step can do without.
        "timers": {"throughput": {"enabled": False}},
    }
    ds.update(_precision_blocks(cfg.precision))
    ds["zero_optimization"] = _zero_block(cfg)
    ds.update(_optimizer_blocks(cfg))
    if cfg.parallel.tp > 1:
        # AutoTP: the Trainer reads autotp_size and splits the linears. Its HF weights are
        # saved only when the 16-bit weights are gathered on save, whatever the stage
        # (docs/evidence/stack.md). train_batch_size is left out: the Trainer's mismatch check
        # and accelerate (ZeRO-3) compute it from the world size, without tp; DeepSpeed
        # derives it from the data-parallel size.
        ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        del ds["train_batch_size"]
        ds["tensor_parallel"] = {"autotp_size": cfg.parallel.tp}
    return ds


def _precision_blocks(precision: PrecisionConfig) -> dict[str, Any]:
    """fp16 is AMP O2 style: DeepSpeed keeps fp16 weights and an fp32 master copy."""
    fp16: dict[str, Any] = {"enabled": precision.name == "fp16"}
    if precision.name == "fp16":
        fp16.update(
            loss_scale=0,  # 0 = dynamic loss scaling
            initial_scale_power=precision.initial_scale_power,
            loss_scale_window=precision.loss_scale_window,
            hysteresis=precision.hysteresis,
            min_loss_scale=precision.min_loss_scale,
        )
    # Both blocks are written so the file says plainly which mode is off.
    return {"fp16": fp16, "bf16": {"enabled": precision.name == "bf16"}}


def _zero_block(cfg: RunConfig) -> dict[str, Any]:
    strategy = cfg.strategy
    stage = strategy.zero_stage
    bucket = bucket_elements(cfg)
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": strategy.overlap_comm,
        "contiguous_gradients": strategy.contiguous_gradients,
        "reduce_bucket_size": bucket,
    }
    if stage < 3:
        # Stages 1 and 2 share DeepSpeed's stage_1_and_2 optimizer, which reads these.
        zero.update(allgather_partitions=True, allgather_bucket_size=bucket, reduce_scatter=True)
    else:
        zero.update(
            stage3_prefetch_bucket_size=int(0.9 * bucket),
            stage3_param_persistence_threshold=10 * cfg.model.hidden_size,
            stage3_max_live_parameters=STAGE3_MAX_LIVE_PARAMETERS,
            stage3_max_reuse_distance=STAGE3_MAX_REUSE_DISTANCE,
            sub_group_size=SUB_GROUP_SIZE,
            stage3_gather_16bit_weights_on_model_save=strategy.gather_weights_on_save,
        )
    # Pinned host memory speeds GPU<->CPU copies; there is no device to copy to on cpu.
    pin = not gpu_preset(cfg.cluster.gpu).is_cpu
    if strategy.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if strategy.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    return zero


def bucket_elements(cfg: RunConfig) -> int:
    """ZeRO's reduce/allgather bucket: strategy.bucket_size, else HF's "auto" rule, hidden x
    hidden elements, but never fewer than MIN_BUCKET_ELEMENTS or an eighth of the model,
    whichever is smaller. Below that every step runs dozens of tiny collectives, each paying
    a full round trip: hidden 64 (the tiny Llama) gave 4096-element buckets, ~40 reduces per
    step and 0.54x the throughput of one bucket on 2 CPU ranks (bench/train_overhead.py).
    Not one bucket for the whole model: ZeRO-2 would then hold every gradient until the end
    of the backward (tests/integration/test_train_strategies.py checks it frees them). Under
    ZeRO-3 the bucket also sizes the parameter prefetch, and HF's rule gathers too little at
    a time on a GPU: there the floor is MIN_STAGE3_BUCKET_ELEMENTS (still at most an eighth)."""
    if cfg.strategy.bucket_size:
        return cfg.strategy.bucket_size
    hidden = cfg.model.hidden_size
    eighth = math.ceil(count_params(cfg.model) / MIN_BUCKETS)
    floor = MIN_STAGE3_BUCKET_ELEMENTS if cfg.strategy.zero_stage == 3 else MIN_BUCKET_ELEMENTS
    return max(hidden * hidden, min(floor, eighth))


def _optimizer_blocks(cfg: RunConfig) -> dict[str, Any]:
    """GPU: DeepSpeed's AdamW (fused / CPU-Adam) driven by the HF scheduler. cpu, or
    train.optimizer=torch: the Trainer's torch AdamW (fused on GPUs), so no FusedAdam or
    DeepSpeedCPUAdam has to be compiled (docs/evidence/stack.md: ~40 s each with ninja)."""
    train = cfg.train
    if gpu_preset(cfg.cluster.gpu).is_cpu or train.optimizer == "torch":
        # The Trainer's torch AdamW; the HF integration sets zero_allow_untested_optimizer
        # too, written here so the file also works outside the Trainer.
        return {"zero_force_ds_cpu_optimizer": False, "zero_allow_untested_optimizer": True}
    return {
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": train.lr,
                "betas": [train.adam_beta1, train.adam_beta2],
                "eps": train.adam_epsilon,
                "weight_decay": train.weight_decay,
            },
        }
    }


def deepspeed_strategies() -> tuple[str, ...]:
    return tuple(n for n, s in concrete_strategies().items() if s.backend == "deepspeed")


def reference_config(strategy: str, precision: str) -> RunConfig:
    """The reference run that ds_configs/ is generated from (llama-7b, 1 node x 8 A100-80G)."""
    return compose_config(["model=llama-7b", "cluster.gpu=a100-80g", "cluster.gpus_per_node=8",
                           f"strategy={strategy}", f"precision={precision}"])


def reference_files() -> dict[str, str]:
    """File name -> text for every DeepSpeed strategy of the table x precision of the
    reference run."""
    files = {}
    for strategy in deepspeed_strategies():
        for precision in PRECISIONS:
            ds = build_ds_config(reference_config(strategy, precision))
            files[f"{strategy}_{precision}.json"] = json_text(ds)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.engines.deepspeed.ds_config",
        description="Write ds_configs/<strategy>_<precision>.json for the reference run.",
    )
    parser.add_argument("--write-all", metavar="DIR", required=True, type=Path)
    args = parser.parse_args(argv)
    args.write_all.mkdir(parents=True, exist_ok=True)
    for name, text in reference_files().items():
        (args.write_all / name).write_text(text, encoding="utf-8")
        print(args.write_all / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
