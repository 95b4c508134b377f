"""What a distributed engine is asked, with the plain data-parallel answers as defaults.
Config-side methods are pure (validation, planner, estimator); rank-side ones run on the
ranks and may import the engine's libraries.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from launcher.config.architecture import is_moe
from launcher.config.schema import RunConfig, StrategyConfig
from launcher.engines.peak_terms import LoraInputs, PeakInputs, Split
from launcher.rundir import RunDir


class Engine:
    name: ClassVar[str]
    """The `strategy.backend` value that selects it."""
    launchers: ClassVar[tuple[str, ...]] = ("torchrun", "deepspeed")
    """`cluster.launcher` values that can start its ranks."""
    settings_file: ClassVar[str | None] = None
    """The run-dir file holding `settings(cfg)` (a launcher/rundir name), if any."""
    universal_settings_file: ClassVar[str | None] = None
    """The run-dir file holding `universal_settings`: written beside `settings_file` when
    the run resumes a checkpoint, which a launch then loads if it converts one."""
    libraries: ClassVar[tuple[str, ...]] = ()
    """Libraries every rank of this engine imports at start-up (launcher/timing.py)."""
    separate_master_weights: ClassVar[bool] = False
    """It keeps fp32 master weights apart from the module, which it casts to the training
    precision (DeepSpeed); otherwise the module's weights stay fp32 under autocast."""
    fills_from_rank_0: ClassVar[bool] = False
    """Only rank 0 reads or builds the weights; the engine gives the others their share."""
    shards: ClassVar[bool] = True
    """It partitions training state over the ranks (strategy=auto's ladder:
    launcher/estimator/auto.py; Adam's states in peak.py's first step)."""

    # ------------------------------------------------------------ config side (pure)

    def problems(self, cfg: RunConfig) -> list[str]:
        """Rules for cfg.strategy under this engine, each naming the key, value and fix."""
        return []

    def tensor_parallel_problems(self, cfg: RunConfig) -> list[str]:
        """Why this strategy cannot split its linears over parallel.tp ranks (tp > 1)."""
        return [f"parallel.tp={cfg.parallel.tp} with strategy={cfg.strategy.name}: tensor "
                f"parallelism runs on DeepSpeed's AutoTP, not on {self.name}. Fix: "
                "strategy=zero1, zero2 or zero3, or parallel.tp=1."]

    def sequence_parallel_problems(self, cfg: RunConfig) -> list[str]:
        """Why this strategy cannot split each sequence over parallel.sp ranks (sp > 1)."""
        return [f"parallel.sp={cfg.parallel.sp} with strategy={cfg.strategy.name}: sequence "
                f"parallelism runs on DeepSpeed Ulysses under ZeRO-3, not on {self.name}. "
                "Fix: strategy=zero3, or parallel.sp=1."]

    def memory_stage(self, strategy: StrategyConfig) -> int:
        """The ZeRO stage its memory behaves like (the ZeRO paper's formulas)."""
        return strategy.zero_stage

    def settings(self, cfg: RunConfig) -> dict[str, Any] | None:
        """The contents of `settings_file`, concrete values only."""
        return None

    def universal_settings(self, settings: dict[str, Any]) -> dict[str, Any] | None:
        """The settings a launch loads when it resumes a checkpoint converted for its world
        size (`checkpoint_for_world`): final when written, like `settings`."""
        return None

    def moments(self, x: PeakInputs, strategy: StrategyConfig) -> dict[str, Split]:
        """Per-rank (device, host) bytes at each moment of a full fine-tune
        (launcher/estimator/peak.py); without `first_step`, peak.py derives it from the
        others."""
        raise NotImplementedError(f"engine {self.name}: no peak-memory moments")

    def lora_moments(self, x: PeakInputs, lo: LoraInputs,
                     strategy: StrategyConfig) -> dict[str, Split]:
        raise NotImplementedError(f"engine {self.name}: no LoRA peak-memory moments")

    # ------------------------------------------------------------ rank side

    def enter_rank(self, cfg: RunConfig) -> None:
        """Before anything is imported or built on a rank (release_rank is its pair)."""

    def release_rank(self) -> None:
        """What a rank must free on its way out, however it leaves (the worker's finally,
        its normal exit, the hang watchdog's exit)."""

    def process_group_backend(self, on_cpu: bool) -> str:
        """The default process group's backend, which the ranks create themselves
        (launcher/rank/startup.py) before accelerate, which then uses it."""
        return "gloo" if on_cpu else "nccl"

    def prepare_model(self, cfg: RunConfig, model: Any, resume: Path | None = None) -> None:
        """The built model (adapters applied), before the Trainer wraps it and loads
        `resume` (the checkpoint it resumes, if any): what this engine must do to it
        (DeepSpeed ZeRO-3: mixtures of experts' leaf modules). Here: an engine that
        shards nothing resumes the Trainer's own weights file, which drops an MoE model's
        experts; they are read first (experts_resume.py)."""
        if resume is None or self.shards or cfg.peft.name != "none" or not is_moe(cfg.model):
            return
        from launcher.engines.experts_resume import restore_experts

        if restore_experts(model, resume) and int(os.environ.get("RANK", "0")) == 0:
            print(f"[ftl] resume: the experts read from {resume} through from_pretrained "
                  "(the Trainer's own load skips them: transformers issue 43701)", flush=True)

    def setup_distributed(self, cfg: RunConfig, on_cpu: bool) -> dict[str, Any]:
        """Pre-configure accelerate where its own detection is wrong; returns the
        TrainingArguments accelerator_config."""
        return {}

    def trainer_kwargs(self, cfg: RunConfig, run_dir: RunDir, on_cpu: bool,
                       load_universal: bool) -> dict[str, Any]:
        """TrainingArguments keywords of this engine (they replace the common ones)."""
        return {}

    def training_arguments(self, kwargs: dict[str, Any], cfg: RunConfig, on_cpu: bool,
                           arguments_class: type | None = None) -> Any:
        """`arguments_class` (the objective's: TrainingArguments or a TRL config, which
        subclass it) of `kwargs` (`trainer_kwargs` included)."""
        if arguments_class is None:
            from transformers import TrainingArguments

            arguments_class = TrainingArguments
        return arguments_class(**kwargs)

    def checkpoint_for_world(self, cfg: RunConfig, run_dir: RunDir,
                             resume: Path | None) -> tuple[Path | None, bool]:
        """What the Trainer loads, and whether it is a universal checkpoint (a checkpoint
        of another world size converted for this one)."""
        return resume, False

    def callbacks(self, universal: bool) -> list[Any]:
        """Trainer callbacks this engine needs on this launch."""
        return []

    def trainer_class(self, cfg: RunConfig) -> type:
        """The Trainer (sub)class the rank builds."""
        from transformers import Trainer

        return Trainer

    def save_final_model(self, trainer: Any, cfg: RunConfig, model_dir: Path) -> Path:
        """RUN_DIR/model: a plain HF directory AutoModelForCausalLM.from_pretrained loads,
        the LoRA update merged in (its adapter in model/adapter). Called on every rank:
        gathering sharded weights is a collective; rank 0 writes."""
        from launcher.engines.final_model import barrier, save_merged_peft_model

        if cfg.peft.name != "none":
            return save_merged_peft_model(trainer, model_dir, cfg.model.path,
                                          lambda: self.full_state_dict(trainer),
                                          gathered=self.shards)
        trainer.save_model(str(model_dir))
        barrier()
        return model_dir

    def full_state_dict(self, trainer: Any) -> dict[str, Any] | None:
        """The whole weights on rank 0 (other ranks may get partial dicts), gathered by
        accelerate where they are sharded; None when they cannot be."""
        return trainer.accelerator.get_state_dict(trainer.model)


def zero_stage_unused(strategy: StrategyConfig) -> list[str]:
    """Engines without ZeRO stages refuse one."""
    if strategy.zero_stage == 0:
        return []
    return [f"strategy.zero_stage={strategy.zero_stage} with strategy={strategy.name} "
            f"({strategy.backend}): ZeRO stages apply to DeepSpeed only. "
            f"Fix: strategy=zero{strategy.zero_stage} or strategy.zero_stage=0."]
