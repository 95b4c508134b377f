"""The per-rank entrypoint: `python -m launcher.worker RUN_DIR`.

Reads ONLY the run dir (config.yaml, ds_config.json or fsdp.json) and, top to bottom:
config -> distributed state -> tokenizer -> TrainingArguments -> model -> data -> Trainer
-> train (resuming from the last complete checkpoint) -> evaluate -> save -> shut down.

Writes into the run dir: checkpoints/ (Trainer output_dir), model/ (final HF model),
metrics.jsonl, result.json and final_logits.pt (rank 0), logs/rank<R>.error on failure.
The CPU workarounds are the ones measured in STACK-NOTES.md; each says why where it is.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from launcher.checkpoints import check_resume_world_size, resume_checkpoint, save_final_model
from launcher.compose import PROJECT_ROOT, to_run_config
from launcher.data import build_datasets
from launcher.errors import ConfigError
from launcher.hardware import gpu_preset
from launcher.schema import RunConfig

LOGITS_SEED = 1234  # the fixed batch whose logits the saved model must reproduce


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m launcher.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0]).resolve()
    try:
        train(run_dir)
    except BaseException:
        write_error(run_dir, traceback.format_exc())
        raise
    return 0


def train(run_dir: Path) -> dict[str, Any]:
    cfg = to_run_config(OmegaConf.load(run_dir / "config.yaml"))
    on_cpu = gpu_preset(cfg.cluster.gpu).is_cpu
    accelerator_config = setup_distributed(cfg, on_cpu)
    quiet_progress_bars()
    tokenizer = load_tokenizer(cfg)
    args = training_arguments(cfg, run_dir, on_cpu, accelerator_config)
    # Built after TrainingArguments: under ZeRO-3 transformers then constructs the model
    # inside deepspeed.zero.Init, so every rank holds only its partition from the start.
    model = apply_peft(build_model(cfg, tokenizer), cfg)
    train_ds, eval_ds = build_datasets(cfg, tokenizer)
    trainer, probes = make_trainer(cfg, run_dir, args, model, tokenizer, train_ds, eval_ds)

    resume = resume_checkpoint(cfg.run.resume, run_dir)
    if resume is not None:
        check_resume_world_size(resume, args.world_size, cfg.strategy.backend)
        print(f"[ftl] rank {args.process_index}: resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    if trainer.state.global_step < trainer.state.max_steps:
        # Stopped early (preemption, FTL_STOP_AFTER_STEP): the last complete checkpoint is
        # the state to continue from; the final eval and model belong to the finished run.
        print(f"[ftl] stopped at step {trainer.state.global_step}; resume continues", flush=True)
        shutdown()
        return {"stopped_at_step": trainer.state.global_step}
    final_eval = final_evaluation(trainer)

    logits = fixed_batch_logits(trainer, tokenizer)
    model_dir = save_final_model(
        trainer, cfg.peft.name != "none", run_dir / "model", base_path=cfg.model.path
    )
    result = collect_result(trainer, probes, final_eval, resume, model_dir)
    if trainer.is_world_process_zero():
        torch.save(logits, run_dir / "final_logits.pt")
        (run_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"[ftl] done: model saved to {model_dir}", flush=True)
    shutdown()
    return result


# --- distributed state -------------------------------------------------------------------


def setup_distributed(cfg: RunConfig, on_cpu: bool) -> dict[str, Any]:
    """Pre-configure accelerate where its own detection is wrong on CPU.

    Returns the TrainingArguments accelerator_config. On GPUs accelerate gets it right.
    """
    backend = cfg.strategy.backend
    if not on_cpu or backend == "ddp":
        return {}  # ddp on CPU: use_cpu=True + gloo is detected correctly
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    if backend == "deepspeed":
        # Without this, accelerate finds no backend for DeepSpeed on CPU and runs each rank
        # as a single process (unsharded data or a train_batch_size assertion).
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="gloo")
    elif backend == "fsdp":
        # With use_cpu accelerate picks MULTI_CPU and silently ignores FSDP (plain DDP).
        # Claiming MULTI_GPU makes it apply FSDP2 (fully_shard) over gloo on CPU tensors.
        state = PartialState(cpu=True, backend="gloo")
        state.distributed_type = DistributedType.MULTI_GPU
    else:
        raise ConfigError(
            f"strategy.backend={backend}: the worker needs ddp, deepspeed or fsdp. "
            "Fix: launch through `ftl train`, which resolves strategy=auto first."
        )
    return {"use_configured_state": True}


def quiet_progress_bars() -> None:
    """Loading/saving bars from every rank garble the launcher's console; steps are
    reported by MetricsCallback instead."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def shutdown() -> None:
    """barrier + destroy: without it runs could abort at interpreter exit (STACK-NOTES)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# --- tokenizer and model -----------------------------------------------------------------


def load_tokenizer(cfg: RunConfig) -> Any:
    from transformers import AutoTokenizer

    source = cfg.model.tokenizer or cfg.model.path
    if not source:
        raise ConfigError(
            f"model.tokenizer: empty, and model.path is empty too (model={cfg.model.name}). "
            "Fix: set model.tokenizer to a tokenizer directory or hub id."
        )
    if not os.path.isabs(source) and (PROJECT_ROOT / source).exists():
        source = str(PROJECT_ROOT / source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # causal LMs often ship without one
    return tokenizer


def build_model(cfg: RunConfig, tokenizer: Any) -> Any:
    """From cfg.model.path (local dir or hub id), else from the architecture numbers."""
    from transformers import AutoConfig, AutoModelForCausalLM, set_seed

    set_seed(cfg.train.seed)  # identical initial weights on every rank
    if cfg.peft.name == "qlora":
        return load_quantized(cfg)
    if cfg.model.path:
        return AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=model_dtype(cfg))
    m = cfg.model
    config = AutoConfig.for_model(
        m.architecture,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        intermediate_size=m.intermediate_size,
        vocab_size=max(m.vocab_size, len(tokenizer)),
        max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_word_embeddings,
        rope_theta=m.rope_theta,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return AutoModelForCausalLM.from_config(config, dtype=model_dtype(cfg))


def model_dtype(cfg: RunConfig) -> torch.dtype:
    """fp32 master weights (AMP and DeepSpeed cast for compute), except a frozen LoRA base,
    which needs no master copy: it stays in bf16 when training in bf16."""
    if cfg.peft.name == "lora" and cfg.precision.name == "bf16":
        return torch.bfloat16
    return torch.float32


def load_quantized(cfg: RunConfig) -> Any:
    """QLoRA base: 4-bit NF4 weights (bitsandbytes); needs weights on disk."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if not cfg.model.path:
        raise ConfigError(
            f"peft=qlora with model={cfg.model.name}: 4-bit loading quantizes existing weights, "
            "and model.path is empty. Fix: set model.path to a saved model, or use peft=lora."
        )
    compute = torch.bfloat16 if cfg.precision.name == "bf16" else torch.float32
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
    )
    device = "cpu" if gpu_preset(cfg.cluster.gpu).is_cpu else int(os.environ.get("LOCAL_RANK", 0))
    return AutoModelForCausalLM.from_pretrained(
        cfg.model.path, quantization_config=quant, device_map={"": device}
    )


def apply_peft(model: Any, cfg: RunConfig) -> Any:
    if cfg.peft.name == "none":
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.peft.name == "qlora":
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=cfg.train.gradient_checkpointing
        )
    lora = LoraConfig(
        r=cfg.peft.r,
        lora_alpha=cfg.peft.alpha,
        lora_dropout=cfg.peft.dropout,
        target_modules=list(cfg.peft.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


# --- TrainingArguments and Trainer -------------------------------------------------------


def training_arguments(
    cfg: RunConfig, run_dir: Path, on_cpu: bool, accelerator_config: dict[str, Any]
) -> Any:
    from transformers import TrainingArguments

    t, backend = cfg.train, cfg.strategy.backend
    bf16, fp16 = cfg.precision.name == "bf16", cfg.precision.name == "fp16"
    # bf16 + DeepSpeed on CPU: TrainingArguments(bf16=True) refuses CPU without use_cpu, and
    # bf16 only in the ds_config is a Trainer mismatch; both are switched on afterwards.
    late_bf16 = bf16 and on_cpu and backend == "deepspeed"
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(run_dir / "tensorboard"))
    kwargs: dict[str, Any] = dict(
        output_dir=str(run_dir / "checkpoints"),
        per_device_train_batch_size=t.micro_batch_size,
        per_device_eval_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.grad_accum,
        max_steps=t.max_steps,
        num_train_epochs=t.epochs,
        learning_rate=t.lr,
        warmup_steps=t.warmup_ratio,  # transformers 5: a float < 1 is a ratio
        lr_scheduler_type=t.lr_scheduler,
        weight_decay=t.weight_decay,
        adam_beta1=t.adam_beta1,
        adam_beta2=t.adam_beta2,
        adam_epsilon=t.adam_epsilon,
        max_grad_norm=t.max_grad_norm,
        save_strategy="steps" if t.save_steps > 0 else "no",
        save_steps=max(t.save_steps, 1),
        logging_steps=t.logging_steps,
        eval_strategy="steps" if t.eval_steps > 0 else "no",
        eval_steps=t.eval_steps if t.eval_steps > 0 else None,
        eval_on_start=True,  # the initial eval loss, measured on the wrapped model
        seed=t.seed,
        data_seed=t.seed,
        # Under FSDP, fsdp_config.activation_checkpointing does it (launcher/fsdp.py).
        activation_checkpointing=t.gradient_checkpointing and backend != "fsdp",
        bf16=bf16 and not late_bf16,
        fp16=fp16,
        report_to=["tensorboard"] if _has_tensorboard() else "none",
        include_num_input_tokens_seen="all",
        accelerator_config=accelerator_config or None,
        ddp_find_unused_parameters=False,
        disable_tqdm=True,  # MetricsCallback prints one progress line per log event
    )
    if on_cpu:
        kwargs.update(
            use_cpu=backend != "deepspeed",
            ddp_backend="gloo",
            optim="adamw_torch",
            dataloader_pin_memory=False,  # pinning needs an accelerator
        )
    if backend == "deepspeed":
        kwargs["deepspeed"] = _ds_config(run_dir, disable_bf16=late_bf16)
    elif backend == "fsdp":
        kwargs.update(json.loads((run_dir / "fsdp.json").read_text()))
    args = TrainingArguments(**kwargs)
    if late_bf16:
        args.bf16 = True
        args.hf_deepspeed_config.config["bf16"] = {"enabled": True}
        args.hf_deepspeed_config._dtype = torch.bfloat16
    if backend == "fsdp":
        from launcher.fsdp import fsdp_plugin_overrides

        # e.g. CPUOffloadPolicy(pin_memory=False): the default pins memory, needing a GPU.
        args.fsdp_plugin_args.update(fsdp_plugin_overrides(cfg))
    return args


def _ds_config(run_dir: Path, disable_bf16: bool) -> str | dict[str, Any]:
    path = run_dir / "ds_config.json"
    if not disable_bf16:
        return str(path)
    config = json.loads(path.read_text())
    config["bf16"] = {"enabled": False}
    return config


def _has_tensorboard() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def make_trainer(
    cfg: RunConfig, run_dir: Path, args: Any, model: Any, tokenizer: Any, train_ds: Any,
    eval_ds: Any,
) -> tuple[Any, dict[str, Any]]:
    from transformers import PrinterCallback, Trainer

    from launcher.callbacks import (
        CheckpointCallback,
        DataloaderProbe,
        MetricsCallback,
        ShardProbe,
        stop_after_step_from_env,
    )
    from launcher.data import collator
    from launcher.preempt import PreemptCallback

    shard_probe, loader_probe = ShardProbe(train_ds), DataloaderProbe()
    metrics = MetricsCallback(run_dir, *model_flops(cfg))
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=shard_probe,
        eval_dataset=eval_ds,
        data_collator=collator(tokenizer),
        processing_class=tokenizer,
        callbacks=[
            CheckpointCallback(stop_after_step_from_env()),
            PreemptCallback(run_dir),
            loader_probe,
        ],
    )
    trainer.remove_callback(PrinterCallback)  # it would print the raw log dicts as well
    # First in line: the fields it adds to each log reach TensorBoard and metrics.jsonl.
    trainer.callback_handler.callbacks.insert(0, metrics)
    return trainer, {"shard": shard_probe, "loader": loader_probe}


def model_flops(cfg: RunConfig) -> tuple[float, float | None]:
    """FLOPs per trained token (the estimator's C = 6PD rule, 4PD for a frozen base) and
    the device's dense peak FLOP/s, or None on CPU where MFU means nothing."""
    from launcher.estimate import count_params, peak_flops, training_flops

    preset = gpu_preset(cfg.cluster.gpu)
    per_token = training_flops(count_params(cfg.model), 1, frozen_base=cfg.peft.name != "none")
    return per_token, None if preset.is_cpu else peak_flops(preset, cfg.precision.name)


# --- after training: logits, save, result ------------------------------------------------


def final_evaluation(trainer: Any) -> dict[str, float]:
    """Eval metrics at the last step: the Trainer's own when eval_steps already ran one
    there (it evaluates at the end of a step-based schedule), else one evaluate() now."""
    if trainer.eval_dataset is None:
        return {}
    for entry in reversed(trainer.state.log_history):
        if "eval_loss" in entry and entry.get("step") == trainer.state.global_step:
            return entry
    return trainer.evaluate()


def fixed_batch_logits(trainer: Any, tokenizer: Any) -> dict[str, torch.Tensor]:
    """Logits of the trained model on a fixed batch; every rank runs the forward
    (ZeRO-3 and FSDP gather parameters collectively), rank 0 keeps them."""
    model = trainer.model
    vocab = min(len(tokenizer), model.config.vocab_size)
    generator = torch.Generator().manual_seed(LOGITS_SEED)
    input_ids = torch.randint(3, vocab, (2, 16), generator=generator)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids.to(trainer.args.device)).logits
    return {"input_ids": input_ids, "logits": logits.float().cpu()}


def dist_barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def collect_result(
    trainer: Any,
    probes: dict[str, Any],
    final_eval: dict[str, float],
    resume: Path | None,
    model_dir: Path,
) -> dict[str, Any]:
    """What actually happened, for the launcher and the tests (rank 0 writes it)."""
    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    return {
        "world_size": trainer.args.world_size,
        "process_group_size": dist.get_world_size() if dist.is_initialized() else 1,
        "num_processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "data": sharding_evidence(probes, len(trainer.train_dataset)),
        "wrapper": wrapper_info(trainer),
        "first_train_loss": losses[0] if losses else None,
        "final_train_loss": losses[-1] if losses else None,
        "initial_eval_loss": evals[0] if evals else None,
        "final_eval_loss": final_eval.get("eval_loss"),
        "global_step": trainer.state.global_step,
        "resumed_from": str(resume) if resume else None,
        "model_dir": str(model_dir),
        "dtype": str(next(trainer.model.parameters()).dtype),
        "activation_checkpointing": bool(
            getattr(trainer.model, "is_activation_checkpointing", False)
        ),
    }


def sharding_evidence(probes: dict[str, Any], dataset_size: int) -> dict[str, Any]:
    """Per rank: batches per epoch and the sample indices it loaded (gathered to all)."""
    local = {"indices": probes["shard"].seen, "batches": probes["loader"].batches_per_epoch}
    gathered: list[Any] = [local]
    if dist.is_initialized():
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
    sets = [set(g["indices"]) for g in gathered]
    union = set().union(*sets)
    return {
        "dataset_size": dataset_size,
        "samples_per_rank": [len(g["indices"]) for g in gathered],
        "unique_samples_per_rank": [len(s) for s in sets],
        "samples_seen_by_several_ranks": sum(len(s) for s in sets) - len(union),
        "batches_per_epoch_per_rank": [g["batches"] for g in gathered],
        "first_indices_per_rank": [g["indices"][:8] for g in gathered],
    }


def wrapper_info(trainer: Any) -> dict[str, Any]:
    """The wrapping really applied: engine ZeRO stage/offload, FSDP class, DDP."""
    info: dict[str, Any] = {
        "model_class": type(trainer.model).__name__,
        "wrapped_class": type(trainer.model_wrapped).__name__,
        "optimizer_class": type(trainer.optimizer).__name__,
        "optimizer_state_device": _optimizer_state_device(trainer.optimizer),
        "base_weights_4bit": any(type(m).__name__ == "Linear4bit" for m in trainer.model.modules()),
    }
    if trainer.is_deepspeed_enabled:
        info.update(_deepspeed_info(trainer.deepspeed))
    if trainer.is_fsdp_enabled:
        info.update(_fsdp_info(trainer.model))
    return info


def _deepspeed_info(engine: Any) -> dict[str, Any]:
    off_opt, off_param = engine.zero_offload_optimizer(), engine.zero_offload_param()
    optimizer = engine.optimizer
    info: dict[str, Any] = {
        "zero_stage": engine.zero_optimization_stage(),
        "offload_optimizer_device": _device_name(off_opt),
        "offload_param_device": _device_name(off_param),
        "zero_optimizer_class": type(optimizer).__name__,
        # What the ZeRO optimizer itself decided (stage 1/2: cpu_offload; 3: offload_optimizer)
        "zero_optimizer_offloads": bool(
            getattr(optimizer, "cpu_offload", False)
            or getattr(optimizer, "offload_optimizer", False)
        ),
        "engine_dtype": str(engine.get_data_types()[0]),
    }
    param = next(engine.module.parameters())
    if hasattr(param, "ds_numel"):  # ZeRO-3: this rank holds a partition only
        info["param_local_fraction"] = param.ds_tensor.numel() / param.ds_numel
    return info


def _fsdp_info(model: Any) -> dict[str, Any]:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    param = next(model.parameters())
    info: dict[str, Any] = {
        "fsdp_module": isinstance(model, FSDPModule),
        "param_class": type(param).__name__,
    }
    if isinstance(param, DTensor):
        info["param_local_fraction"] = param.to_local().numel() / param.numel()
    policies = {
        type(group.offload_policy).__name__
        for module in model.modules()
        if isinstance(module, FSDPModule)
        # no public accessor for a module's offload policy (torch 2.13)
        for group in module._get_fsdp_state()._fsdp_param_groups
    }
    info["offload_policies"] = sorted(policies)
    return info


def _device_name(offload: Any) -> str | None:
    device = getattr(offload, "device", None)
    if device is None:
        return None
    name = str(getattr(device, "value", device))
    return None if name == "none" else name


def _optimizer_state_device(optimizer: Any) -> str | None:
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate / ZeRO wrappers
    inner = getattr(inner, "optimizer", inner)
    for state in getattr(inner, "state", {}).values():
        for value in state.values():
            if torch.is_tensor(value) and value.dim() > 0:
                return str(value.device)
    return None


def write_error(run_dir: Path, text: str) -> None:
    """logs/rank<R>.error: the launcher names the failed rank and points here."""
    rank = os.environ.get("RANK", "0")
    try:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs" / f"rank{rank}.error").write_text(text)
    except OSError:
        pass  # the traceback still reaches stderr via the re-raise


def exit_now(code: int) -> None:
    """Leave without interpreter teardown once everything is written and the process
    group is destroyed: teardown can still abort ("terminate called without an active
    exception", SIGABRT, seen with DeepSpeed on gloo even after barrier + destroy), which
    would turn a finished run into a failed one."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
