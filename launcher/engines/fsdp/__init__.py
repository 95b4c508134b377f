"""FSDP2 through accelerate: its settings (settings.py), peak-memory moments (in
launcher/engines/peak_terms.py terms) and the CPU workarounds of its ranks
(docs/evidence/stack.md). A sharded checkpoint resumes on another world size through
torch.distributed.checkpoint, with nothing to convert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from launcher import rundir
from launcher.config.schema import RunConfig, StrategyConfig
from launcher.engines.base import Engine, zero_stage_unused
from launcher.engines.fsdp.settings import build_fsdp_settings, fsdp_plugin_overrides
from launcher.engines.peak_terms import (
    LoraInputs,
    PeakInputs,
    Split,
    adam_temporaries,
    larger,
)
from launcher.rundir import RunDir


class FsdpEngine(Engine):
    name: ClassVar[str] = "fsdp"
    launchers: ClassVar[tuple[str, ...]] = ("torchrun",)
    settings_file: ClassVar[str | None] = rundir.FSDP
    fills_from_rank_0: ClassVar[bool] = True

    def problems(self, cfg: RunConfig) -> list[str]:
        strategy, problems = cfg.strategy, zero_stage_unused(cfg.strategy)
        if strategy.offload_param != strategy.offload_optimizer:
            # FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer state together.
            problems.append(
                f"strategy.offload_param={str(strategy.offload_param).lower()} and "
                f"strategy.offload_optimizer={str(strategy.offload_optimizer).lower()} with "
                f"strategy={strategy.name}: FSDP offloads parameters and optimizer state "
                "together. Fix: set both the same (strategy=fsdp_offload sets both true).")
        return problems

    def memory_stage(self, strategy: StrategyConfig) -> int:
        return 3  # parameters, gradients and optimizer state all sharded

    def settings(self, cfg: RunConfig) -> dict[str, Any]:
        return build_fsdp_settings(cfg)

    def moments(self, x: PeakInputs, strategy: StrategyConfig) -> dict[str, Split]:
        return fsdp_moments(x, strategy.offload_param)  # = offload_optimizer (problems)

    def lora_moments(self, x: PeakInputs, lo: LoraInputs,
                     strategy: StrategyConfig) -> dict[str, Split]:
        return lora_fsdp_moments(x, lo, strategy.offload_param)

    # ------------------------------------------------------------ rank side

    def process_group_backend(self, on_cpu: bool) -> str:
        # accelerate's own choice for FSDP with CPU offload or a full state dict on GPUs:
        # those move CPU tensors through collectives, which NCCL alone cannot.
        return "gloo" if on_cpu else "cuda:nccl,cpu:gloo"

    def setup_distributed(self, cfg: RunConfig, on_cpu: bool) -> dict[str, Any]:
        if not on_cpu:
            return {}
        from accelerate import PartialState
        from accelerate.utils import DistributedType

        # With use_cpu accelerate picks MULTI_CPU and silently ignores FSDP (plain DDP).
        # Claiming MULTI_GPU makes it apply FSDP2 (fully_shard) over gloo on CPU.
        state = PartialState(cpu=True, backend="gloo")
        state.distributed_type = DistributedType.MULTI_GPU
        return {"use_configured_state": True}

    def trainer_kwargs(self, cfg: RunConfig, run_dir: RunDir, on_cpu: bool,
                       load_universal: bool) -> dict[str, Any]:
        # fsdp_config.activation_checkpointing does it; the Trainer's own would add a
        # redundant all-gather in backward (transformers issue 30404).
        return {**json.loads(run_dir.fsdp.read_text()), "activation_checkpointing": False}

    def training_arguments(self, kwargs: dict[str, Any], cfg: RunConfig, on_cpu: bool,
                           arguments_class: type | None = None) -> Any:
        args = super().training_arguments(kwargs, cfg, on_cpu, arguments_class)
        # e.g. CPUOffloadPolicy(pin_memory=False): the default pins memory, needing a GPU.
        args.fsdp_plugin_args.update(fsdp_plugin_overrides(cfg))
        return args

    def save_final_model(self, trainer: Any, cfg: RunConfig, model_dir: Path) -> Path:
        # Sharded checkpoints are right for resuming; the final model must be whole.
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
        return super().save_final_model(trainer, cfg, model_dir)


def _placed(offload: bool, device: float, host: float) -> Split:
    """FSDP's states: on the host under CPUOffloadPolicy, else on the device with the rest."""
    return (device, host) if offload else (device + host, 0.0)


def fsdp_moments(x: PeakInputs, offload: bool) -> dict[str, Split]:
    """FSDP2: fp32 shards 4psi/N + Adam 8psi/N; the forward unshards a layer at a time (p
    bytes under a 16-bit MixedPrecisionPolicy: derived), the backward holds one unsharded
    layer's params and two layers' unsharded grads before reduce-scatter, plus the sharded
    grads 4psi/N. CPUOffloadPolicy keeps shards, grads and Adam on the host (measured on
    the cpu preset: byte-identical to fsdp there; the GPU/host split is derived)."""
    psi, p, part = x.psi, x.p, x.psi / x.n
    layer = p * x.layer_psi
    kept = p * psi if not x.reshard_after_forward else 2.0 * layer  # unsharded params
    forward = x.acts + x.recompute + kept
    backward = 3.0 * layer + (kept - 2.0 * layer)
    states = 12.0 * part
    grads = 4.0 * part
    fwd_bwd = larger(_placed(offload, forward, states),
                     _placed(offload, backward, states + grads))
    temps = adam_temporaries(x, x.largest_tensor / x.n, flat=False)
    # FULL_STATE_DICT: rank 0 gathers the full fp32 Adam state (8psi), offloaded to its host
    # tensor by tensor (accelerate's StateDictOptions(cpu_offload=True))
    save = 8.0 * psi if x.gather_on_save else 0.0
    rank0 = _placed(offload, 0.0, states)
    # the full fp32 model: built on rank 0's host, allocated but never written on the other
    # ranks' (launcher/model.unfilled_model: the allocator counts it, RSS does not), then
    # sharded onto the device
    return {"construction": (4.0 * part, 4.0 * psi), "between_steps": rank0,
            "forward_backward": fwd_bwd,
            "optimizer_step": _placed(offload, 0.0, states + grads + temps),
            "checkpoint": (rank0[0], rank0[1] + save), "checkpoint_other_ranks": rank0}


def lora_fsdp_moments(x: PeakInputs, lo: LoraInputs, offload: bool) -> dict[str, Split]:
    """FSDP2 shards base and adapters alike (the model's bytes / N) + Adam 8a/N. Measured
    peak at the backward's start: three unsharded layers (p bytes per parameter under a
    16-bit MixedPrecisionPolicy: derived) while every activation still lives. The
    Trainer's checkpoint gathers the full model state dict on rank 0 (FULL_STATE_DICT)
    while each rank gathers tensor by tensor (3 x the largest: 33.8M on rank 1, to the
    byte); the final save gathers it again and merges; the final eval unshards layers."""
    n, part = x.n, lo.adapters / x.n
    layer = x.p * (x.layer_psi + lo.layer_adapters)
    states = lo.model(x.psi) / n + 8.0 * part
    grads = lo.adapter_bytes * part
    full_tensor = lo.base_bytes * x.largest_tensor  # one parameter gathered whole
    d, h = between = _placed(offload, 0.0, states)
    # the gathered state dict goes to rank 0's host (cpu_offload=True), the merge runs there
    return {"construction": (lo.model(x.psi) / n, lo.model(x.psi)),
            "between_steps": between,
            "forward_backward": _placed(offload, 3.0 * layer + x.acts + x.recompute,
                                       states + grads),
            "optimizer_step": _placed(offload, 0.0, states + grads + adam_temporaries(
                x, lo.largest_adapter / n, flat=False)),
            "checkpoint": (d + full_tensor, h + lo.model(x.psi)),
            "checkpoint_other_ranks": (d + 3.0 * full_tensor, h),
            "final": (d + full_tensor, h + lo.model(x.psi) + lo.merge_temporaries),
            "final_other_ranks": (d + 3.0 * layer, h)}
