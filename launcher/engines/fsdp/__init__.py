"""FSDP2 through accelerate: its settings (settings.py), peak-memory moments (moments.py)
and the CPU workarounds of its ranks (docs/stack-notes.md). A sharded checkpoint resumes
on another world size through torch.distributed.checkpoint, with nothing to convert."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from launcher import rundir
from launcher.config.schema import RunConfig, StrategyConfig
from launcher.engines.base import Engine, zero_stage_unused
from launcher.engines.fsdp.moments import fsdp_moments, lora_fsdp_moments
from launcher.engines.fsdp.settings import build_fsdp_settings, fsdp_plugin_overrides
from launcher.estimator.peak_terms import LoraInputs, PeakInputs, Split, with_first_step
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
        offload = strategy.offload_param  # equal to offload_optimizer (problems)
        return with_first_step(fsdp_moments(x, offload), 8.0 * x.psi / x.n, offload)

    def lora_moments(self, x: PeakInputs, lo: LoraInputs,
                     strategy: StrategyConfig) -> dict[str, Split]:
        offload = strategy.offload_param
        return with_first_step(lora_fsdp_moments(x, lo, offload), 8.0 * lo.adapters / x.n,
                               offload)

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

    def training_arguments(self, kwargs: dict[str, Any], cfg: RunConfig, on_cpu: bool) -> Any:
        args = super().training_arguments(kwargs, cfg, on_cpu)
        # e.g. CPUOffloadPolicy(pin_memory=False): the default pins memory, needing a GPU.
        args.fsdp_plugin_args.update(fsdp_plugin_overrides(cfg))
        return args
