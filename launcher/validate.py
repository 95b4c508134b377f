"""Cross-field rules. Every rule adds to one list, so the user sees every problem at once.

Each message names the key as typed on the command line, its value, and the fix.
Pure: reads the RunConfig only (launch-time checks that look at this machine live in cli.py).
"""

from __future__ import annotations

from collections.abc import Callable

from launcher.errors import ConfigError
from launcher.hardware import GPU_PRESETS
from launcher.schema import RunConfig

CHOICES: dict[str, tuple[str, ...]] = {
    "precision.name": ("fp32", "fp16", "bf16"),
    "strategy.backend": ("ddp", "deepspeed", "fsdp", "auto"),
    "cluster.name": ("local", "slurm"),
    "cluster.launcher": ("torchrun", "deepspeed"),
    "cluster.gpu": tuple(GPU_PRESETS),
    "peft.name": ("none", "lora", "qlora"),
    "dataset.format": ("alpaca", "sharegpt", "text"),
    "train.lr_scheduler": ("cosine", "linear", "constant", "constant_with_warmup", "polynomial"),
}

Rule = Callable[[RunConfig], list[str]]


def validate(cfg: RunConfig, *, launching_locally: bool = False) -> None:
    """Raise one ConfigError listing every problem; `launching_locally` adds `ftl train` rules."""
    rules: list[Rule] = [_choices, _positive, _precision, _strategy, _batch, _model, _peft]
    if launching_locally:
        rules.append(_local_launch)
    problems = [problem for rule in rules for problem in rule(cfg)]
    if problems:
        raise ConfigError(problems)


def _get(cfg: RunConfig, dotted: str) -> object:
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def _choices(cfg: RunConfig) -> list[str]:
    problems = []
    for key, allowed in CHOICES.items():
        value = _get(cfg, key)
        if value not in allowed:
            problems.append(f"{key}={value}: not one of {', '.join(allowed)}. Fix: pick one.")
    return problems


POSITIVE = (
    "cluster.nodes", "cluster.gpus_per_node", "train.micro_batch_size", "train.grad_accum",
    "train.lr", "train.save_steps", "train.logging_steps", "dataset.max_length", "train.mfu",
)


def _positive(cfg: RunConfig) -> list[str]:
    problems = [
        f"{key}={_get(cfg, key)}: must be greater than 0. Fix: set {key} to a positive value."
        for key in POSITIVE
        if _get(cfg, key) <= 0  # type: ignore[operator]
    ]
    train = cfg.train
    if train.max_steps == 0 or train.max_steps < -1:
        problems.append(
            f"train.max_steps={train.max_steps}: must be a positive step count, or -1 to run "
            "train.epochs epochs. Fix: e.g. train.max_steps=1000."
        )
    if train.max_steps == -1 and train.epochs <= 0:
        problems.append(
            f"train.epochs={train.epochs}: must be greater than 0 when train.max_steps=-1. "
            "Fix: train.epochs=1 or set train.max_steps."
        )
    if train.eval_steps < 0:
        problems.append(f"train.eval_steps={train.eval_steps}: must be >= 0 (0: at the end).")
    if not 0 <= train.warmup_ratio < 1:
        problems.append(f"train.warmup_ratio={train.warmup_ratio}: must be in [0, 1).")
    if train.mfu > 1:
        problems.append(f"train.mfu={train.mfu}: a utilisation in (0, 1]. Fix: e.g. 0.4.")
    if not 0 < cfg.cluster.master_port < 65536:
        problems.append(f"cluster.master_port={cfg.cluster.master_port}: not a TCP port.")
    return problems


def _precision(cfg: RunConfig) -> list[str]:
    name, gpu = cfg.precision.name, cfg.cluster.gpu
    preset = GPU_PRESETS.get(gpu)
    if preset is None:
        return []
    if name == "fp16" and not preset.supports_fp16:
        where = "CPU training (cluster.gpu=cpu)" if preset.is_cpu else f"cluster.gpu={gpu}"
        return [
            f"precision=fp16: {where} cannot run fp16 mixed precision. "
            "Fix: precision=bf16 or precision=fp32 here, or a GPU preset (cluster.gpu=a100-80g)."
        ]
    if name == "bf16" and not preset.supports_bf16:
        return [
            f"precision=bf16: cluster.gpu={gpu} has no bf16 support. "
            "Fix: precision=fp16 (AMP with loss scaling) or a newer preset (cluster.gpu=a100-80g)."
        ]
    return []


def _strategy(cfg: RunConfig) -> list[str]:
    strategy, problems = cfg.strategy, []
    backend, stage = strategy.backend, strategy.zero_stage
    if backend == "deepspeed" and stage not in (1, 2, 3):
        problems.append(
            f"strategy.zero_stage={stage}: DeepSpeed strategies use ZeRO stage 1, 2 or 3. "
            "Fix: strategy=zero1|zero2|zero3, or strategy=ddp for no sharding."
        )
    if backend in ("ddp", "fsdp") and stage != 0:
        problems.append(
            f"strategy.zero_stage={stage} with strategy={strategy.name} ({backend}): ZeRO stages "
            f"apply to DeepSpeed only. Fix: strategy=zero{stage} or strategy.zero_stage=0."
        )
    if strategy.offload_param and backend == "deepspeed" and stage != 3:
        problems.append(
            f"strategy.offload_param=true with ZeRO stage {stage}: parameter offload needs "
            "ZeRO-3. Fix: strategy=zero3_offload, or strategy.offload_param=false."
        )
    if backend == "ddp" and (strategy.offload_param or strategy.offload_optimizer):
        problems.append(
            "strategy=ddp with offload: DDP keeps everything on the GPU. "
            "Fix: strategy=zero2_offload, zero3_offload or fsdp_offload."
        )
    if backend == "fsdp" and cfg.cluster.launcher == "deepspeed":
        problems.append(
            f"strategy={strategy.name} with cluster.launcher=deepspeed: FSDP is started by "
            "torchrun, not the deepspeed launcher. Fix: cluster.launcher=torchrun."
        )
    return problems


def _batch(cfg: RunConfig) -> list[str]:
    train, requested = cfg.train, cfg.train.global_batch_size
    if requested is None or min(train.micro_batch_size, train.grad_accum, cfg.world_size) <= 0:
        return []
    actual = train.micro_batch_size * train.grad_accum * cfg.world_size
    if requested == actual:
        return []
    per_step = train.micro_batch_size * cfg.world_size
    fix = (
        f"train.grad_accum={requested // per_step}"
        if requested % per_step == 0
        else "a train.global_batch_size divisible by train.micro_batch_size x world size "
        f"({per_step})"
    )
    return [
        f"train.global_batch_size={requested}: train.micro_batch_size x train.grad_accum x "
        f"world size (cluster.nodes x cluster.gpus_per_node) = {train.micro_batch_size} x "
        f"{train.grad_accum} x {cfg.world_size} = {actual}. Fix: {fix}."
    ]


def _model(cfg: RunConfig) -> list[str]:
    model, problems = cfg.model, []
    if model.num_heads <= 0 or model.hidden_size % model.num_heads:
        problems.append(
            f"model.num_heads={model.num_heads}: must divide model.hidden_size="
            f"{model.hidden_size}. Fix: correct the model's architecture numbers."
        )
    if model.num_kv_heads <= 0 or model.num_heads % max(model.num_kv_heads, 1):
        problems.append(
            f"model.num_kv_heads={model.num_kv_heads}: must divide model.num_heads="
            f"{model.num_heads}. Fix: correct the model's architecture numbers."
        )
    if cfg.dataset.max_length > model.max_position_embeddings:
        problems.append(
            f"dataset.max_length={cfg.dataset.max_length}: longer than the model's "
            f"model.max_position_embeddings={model.max_position_embeddings}. "
            f"Fix: dataset.max_length={model.max_position_embeddings} or less."
        )
    return problems


def _peft(cfg: RunConfig) -> list[str]:
    peft, problems = cfg.peft, []
    if peft.name != "none" and (peft.r <= 0 or peft.alpha <= 0):
        problems.append(f"peft.r={peft.r}, peft.alpha={peft.alpha}: both must be positive.")
    if peft.name == "qlora" and peft.bits not in (4, 8):
        problems.append(f"peft.bits={peft.bits}: QLoRA loads 4- or 8-bit base weights.")
    if peft.name == "qlora" and (cfg.strategy.backend == "fsdp" or cfg.strategy.zero_stage == 3):
        problems.append(
            f"peft=qlora with strategy={cfg.strategy.name}: quantized base weights are not "
            "sharded here. Fix: strategy=ddp, zero1 or zero2 (the base model is small in 4-bit)."
        )
    return problems


def _local_launch(cfg: RunConfig) -> list[str]:
    cluster, problems = cfg.cluster, []
    if cluster.name != "local":
        problems.append(
            f"cluster={cluster.name}: `ftl train` runs on this machine. "
            "Fix: `ftl submit cluster=slurm ...` for a batch job, or cluster=local."
        )
    multi_node_ok = cluster.launcher == "deepspeed" and cluster.hostfile
    if cluster.name == "local" and cluster.nodes > 1 and not multi_node_ok:
        problems.append(
            f"cluster.nodes={cluster.nodes} with cluster=local: a local run uses this machine "
            "only. Fix: cluster.nodes=1, `ftl submit cluster=slurm cluster.nodes="
            f"{cluster.nodes}`, or cluster.launcher=deepspeed with cluster.hostfile=PATH."
        )
    if cfg.strategy.backend == "auto":
        problems.append("strategy=auto must be resolved by the planner before launch.")
    return problems
