"""DeepSpeed ZeRO 1/2/3 (with CPU offload): its ds_config (ds_config.py), peak-memory
moments (moments.py), resume on another world size (universal.py) and the CPU
workarounds of its ranks (docs/evidence/stack.md)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from launcher import rundir
from launcher.config.schema import RunConfig, StrategyConfig
from launcher.engines.base import Engine
from launcher.engines.deepspeed.ds_config import build_ds_config
from launcher.engines.deepspeed.moments import (
    lora_zero3_moments,
    lora_zero12_moments,
    zero3_moments,
    zero12_moments,
)
from launcher.engines.peak_terms import LoraInputs, PeakInputs, Split
from launcher.rundir import RunDir


class DeepSpeedEngine(Engine):
    name: ClassVar[str] = "deepspeed"
    settings_file: ClassVar[str | None] = rundir.DS_CONFIG
    universal_settings_file: ClassVar[str | None] = rundir.UNIVERSAL_DS_CONFIG
    libraries: ClassVar[tuple[str, ...]] = ("deepspeed",)
    separate_master_weights: ClassVar[bool] = True

    def problems(self, cfg: RunConfig) -> list[str]:
        strategy, problems = cfg.strategy, []
        stage = strategy.zero_stage
        if stage not in (1, 2, 3):
            problems.append(
                f"strategy.zero_stage={stage}: DeepSpeed strategies use ZeRO stage 1, 2 or 3. "
                "Fix: strategy=zero1|zero2|zero3, or strategy=ddp for no sharding.")
        if strategy.offload_param and stage != 3:
            problems.append(
                f"strategy.offload_param=true with ZeRO stage {stage}: parameter offload needs "
                "ZeRO-3. Fix: strategy=zero3_offload, or strategy.offload_param=false.")
        return problems

    def tensor_parallel_problems(self, cfg: RunConfig) -> list[str]:
        strategy = cfg.strategy
        if not (strategy.offload_optimizer or strategy.offload_param):
            return []  # AutoTP under ZeRO 1/2/3: docs/evidence/stack.md
        return [f"parallel.tp={cfg.parallel.tp} with strategy={strategy.name}: AutoTP with "
                "offload is not supported here. Fix: strategy=zero1, zero2 or zero3."]

    def sequence_parallel_problems(self, cfg: RunConfig) -> list[str]:
        """Ulysses is measured right under ZeRO-3 only: under ZeRO-1/2 its gradients come
        out sp times too large (docs/evidence/stack.md)."""
        strategy, sp, problems = cfg.strategy, cfg.parallel.sp, []
        if strategy.zero_stage != 3:
            problems.append(
                f"parallel.sp={sp} with strategy={strategy.name}: Ulysses sequence parallelism "
                f"under ZeRO-{strategy.zero_stage} gives gradients {sp} times too large. Fix: "
                "strategy=zero3, or parallel.sp=1.")
        elif strategy.offload_optimizer or strategy.offload_param:
            problems.append(
                f"parallel.sp={sp} with strategy={strategy.name}: sequence parallelism with "
                "offload is not measured here. Fix: strategy=zero3, or parallel.sp=1.")
        return problems

    def settings(self, cfg: RunConfig) -> dict[str, Any]:
        return build_ds_config(cfg)

    def moments(self, x: PeakInputs, strategy: StrategyConfig) -> dict[str, Split]:
        offload = _offload_of_stage(strategy)
        if strategy.zero_stage == 3:
            return zero3_moments(x, offload, strategy.offload_param)
        return zero12_moments(x, strategy.zero_stage, offload)

    def lora_moments(self, x: PeakInputs, lo: LoraInputs,
                     strategy: StrategyConfig) -> dict[str, Split]:
        offload = _offload_of_stage(strategy)
        if strategy.zero_stage == 3:  # its first step is measured, not derived
            return lora_zero3_moments(x, lo, offload, strategy.offload_param)
        return lora_zero12_moments(x, lo, strategy.zero_stage, offload)

    # ------------------------------------------------------------ rank side

    def enter_rank(self, cfg: RunConfig) -> None:
        from launcher.engines.deepspeed import ops

        # Before DeepSpeed builds or loads an op: this environment's build cache, and a
        # clear error rather than an endless wait on a killed build's lock.
        ops.check_build_locks(ops.use_own_build_cache())

    def release_rank(self) -> None:
        """DeepSpeed's CPU all-reduce (ops/csrc/cpu/comm/shm.cpp) creates one ~66 MB POSIX
        shared-memory segment per rank, named after the user, MASTER_ADDR, MASTER_PORT and
        the rank, and never unlinks it: /dev/shm is RAM, and 226 of them (15 GB) had piled
        up on the test machine. Each rank removes its own when it leaves; a peer's mapping
        stays valid until that peer exits. Nothing to do when DeepSpeed never created one."""
        env = os.environ
        name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR', '')}_"
                f"{env.get('MASTER_PORT', '')}_{env.get('RANK', '0')}")
        with contextlib.suppress(OSError):
            (Path("/dev/shm") / name).unlink()

    def prepare_model(self, cfg: RunConfig, model: Any, resume: Path | None = None) -> None:
        """ZeRO-3: blocks that hold a list of experts become leaf modules (leaf_modules.py).
        A resume loads DeepSpeed's own module states, keyed as the module is."""
        if cfg.strategy.zero_stage != 3:
            return
        from launcher.engines.deepspeed.leaf_modules import mark_expert_blocks

        marked = mark_expert_blocks(model)
        if marked and int(os.environ.get("RANK", "0")) == 0:
            print(f"[ftl] ZeRO-3 leaf modules (all experts gathered at once): "
                  f"{', '.join(marked)}", flush=True)

    def setup_distributed(self, cfg: RunConfig, on_cpu: bool) -> dict[str, Any]:
        if not on_cpu:
            return {}
        from accelerate import PartialState

        if cfg.parallel.sp > 1:
            # With use_cpu, accelerate never starts DeepSpeed's comm layer, which Ulysses's
            # process groups need (`assert dist.is_initialized()` in parallel_state_sp).
            import deepspeed

            deepspeed.init_distributed(dist_backend="gloo")
        # Without this, accelerate finds no backend for DeepSpeed on CPU and runs each rank
        # as a single process (unsharded data or a train_batch_size assertion).
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="gloo")
        return {"use_configured_state": True}

    def universal_settings(self, settings: dict[str, Any]) -> dict[str, Any] | None:
        return {**settings, "checkpoint": {**settings.get("checkpoint", {}),
                                           "load_universal": True}}

    def trainer_kwargs(self, cfg: RunConfig, run_dir: RunDir, on_cpu: bool,
                       load_universal: bool) -> dict[str, Any]:
        settings = run_dir.universal_ds_config if load_universal else run_dir.ds_config
        if not settings.is_file():
            raise RuntimeError(f"{settings} is missing: a run dir for DeepSpeed holds it. Fix: "
                               "launch again with ftl train or ftl submit (they write it).")
        kwargs: dict[str, Any] = {"deepspeed": str(settings)}
        if on_cpu:
            kwargs["use_cpu"] = False  # the Trainer's CPU path would bypass DeepSpeed
        if cfg.parallel.sp > 1:
            from launcher.engines.deepspeed.ulysses import parallelism_config

            kwargs["parallelism_config"] = parallelism_config(cfg.parallel.sp,
                                                             cfg.model.attn_implementation)
        return kwargs

    def training_arguments(self, kwargs: dict[str, Any], cfg: RunConfig, on_cpu: bool,
                           arguments_class: type | None = None) -> Any:
        bf16_on_cpu = on_cpu and cfg.precision.name == "bf16"
        with _bf16_check_asks_deepspeed() if bf16_on_cpu else contextlib.nullcontext():
            return super().training_arguments(kwargs, cfg, on_cpu, arguments_class)

    def checkpoint_for_world(self, cfg: RunConfig, run_dir: RunDir,
                             resume: Path | None) -> tuple[Path | None, bool]:
        """A ZeRO checkpoint from another world size is converted first (universal.py),
        before the process group exists."""
        from launcher.engines.deepspeed.universal import needs_universal, universal_resume

        if not needs_universal(resume, cfg.world_size):
            return resume, False
        assert resume is not None
        rank = int(os.environ.get("RANK", "0"))
        return universal_resume(run_dir, resume, rank, cfg.dataset.wait_timeout_s), True

    def callbacks(self, universal: bool) -> list[Any]:
        if not universal:
            return []
        from launcher.engines.deepspeed.universal import UntiedOptimizerSteps

        return [UntiedOptimizerSteps()]

    def trainer_class(self, cfg: RunConfig) -> type:
        if cfg.parallel.sp == 1:
            return super().trainer_class(cfg)
        from launcher.engines.deepspeed.ulysses import trainer_class

        return trainer_class()

    def save_final_model(self, trainer: Any, cfg: RunConfig, model_dir: Path) -> Path:
        """ZeRO-3 gathers the weights on save (stage3_gather_16bit_weights_on_model_save);
        without that it leaves shards, rebuilt here into fp32 weights (zero_to_fp32)."""
        saved = super().save_final_model(trainer, cfg, model_dir)
        if cfg.peft.name != "none":
            return saved
        from launcher.engines.final_model import barrier, has_weights

        if trainer.is_world_process_zero() and not has_weights(model_dir):
            _consolidate_zero_checkpoint(trainer, model_dir)
        barrier()
        return model_dir

    def full_state_dict(self, trainer: Any) -> dict[str, Any] | None:
        try:
            return trainer.accelerator.get_state_dict(trainer.deepspeed)
        except ValueError:  # ZeRO-3 without gather-on-save: only the adapter is written
            print("[ftl] ZeRO-3 weights not gathered on save: model/adapter only", flush=True)
            return None


def _consolidate_zero_checkpoint(trainer: Any, model_dir: Path) -> None:
    """Fp32 weights from the ZeRO shards the save left in model_dir; the shards (with the
    optimizer states) stay in checkpoints/, so model/ is a plain HF dir."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state_dict = get_fp32_state_dict_from_zero_checkpoint(str(model_dir))
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.save_pretrained(str(model_dir), state_dict=state_dict)
    names = ("latest", "zero_to_fp32.py", "zero_to_torch.py")
    for leftover in [*model_dir.glob("global_step*"), *(model_dir / name for name in names)]:
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink(missing_ok=True)


def _offload_of_stage(strategy: StrategyConfig) -> bool:
    """Its offload_optimizer; a stage validation refuses has no moments (a caller's bug)."""
    if strategy.zero_stage not in (1, 2, 3):
        raise ValueError(f"peak memory: no moments for strategy {strategy.name} (ZeRO stage "
                         f"{strategy.zero_stage})")
    return strategy.offload_optimizer


@contextlib.contextmanager
def _bf16_check_asks_deepspeed() -> Iterator[None]:
    """TrainingArguments(bf16=True) asks whether a GPU does bf16 and refuses otherwise
    (unless use_cpu, which bypasses DeepSpeed); on CPU the ranks run DeepSpeed's CPU
    accelerator, so its answer is the right one while the arguments are built."""
    from deepspeed.accelerator import get_accelerator
    from transformers import training_args

    gpu_check = training_args.is_torch_bf16_gpu_available
    training_args.is_torch_bf16_gpu_available = get_accelerator().is_bf16_supported
    try:
        yield
    finally:
        training_args.is_torch_bf16_gpu_available = gpu_check
