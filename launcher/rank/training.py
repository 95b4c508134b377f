"""One rank's Trainer: TrainingArguments from the run dir, callbacks, the CPU heap."""

from __future__ import annotations

import os
from typing import Any

from launcher.config.architecture import is_moe
from launcher.config.objectives import is_dpo
from launcher.config.report_to import requested
from launcher.config.schema import RunConfig
from launcher.engines.base import Engine
from launcher.launchers.supervisor import Supervisor
from launcher.rank.objective import arguments_class, objective_kwargs, trainer_parts
from launcher.rank.watchdog import collective_timeout_s
from launcher.rundir import PlanRecord, RunDir


def keep_freed_memory() -> None:
    """On CPU, keep the step's tensors' memory in the heap between steps (glibc malloc).
    glibc serves 128 KiB and more with mmap and unmaps it on free, unless an earlier large
    free raised that threshold for good: each step then page-faults its activations afresh
    (tiny Llama, 2 CPU ranks: ~800 faults and ~3 ms of system time per ~35 ms step, ~10 %
    of the throughput, depending on which libraries were imported). Without glibc's
    mallopt: nothing to do."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's largest (64-bit): all below from the heap
    mallopt(m_trim_threshold, 64 * 2**20)  # freed heap kept for reuse: 2x, glibc's own rule


def training_arguments(
    cfg: RunConfig, engine: Engine, run_dir: RunDir, on_cpu: bool,
    accelerator_config: dict[str, Any], resuming: bool, load_universal: bool = False,
) -> Any:
    t = cfg.train
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(run_dir.tensorboard))
    kwargs: dict[str, Any] = dict(
        output_dir=str(run_dir.checkpoints),
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
        save_total_limit=t.save_total_limit or None,
        logging_steps=t.logging_steps,
        eval_strategy="steps" if t.eval_steps > 0 else "no",
        eval_steps=t.eval_steps if t.eval_steps > 0 else None,
        # A resumed launch continues a run whose start was evaluated already.
        eval_on_start=t.eval_on_start and not resuming,
        seed=t.seed,
        data_seed=t.seed,
        activation_checkpointing=t.gradient_checkpointing,
        use_liger_kernel=t.liger_kernel,  # validation/speed.py: GPU presets, installed
        torch_compile=t.compile,  # inductor; the compile's seconds: callbacks/metrics.py
        bf16=cfg.precision.name == "bf16",
        fp16=cfg.precision.name == "fp16",
        # Only rank 0 logs (the integrations log nowhere else): the others skip importing
        # them (mlflow: ~2 s of CPU on the ranks' shared cores). launcher/rank/tracker_runs.py
        report_to=requested(cfg) if int(os.environ.get("RANK", "0")) == 0 else [],
        run_name=cfg.run.name,  # the tracker run's name
        include_num_input_tokens_seen="all",
        accelerator_config=accelerator_config or None,
        ddp_find_unused_parameters=False,
        # Collectives outwait the hang watchdog, so it is the one that reports a hang.
        ddp_timeout=collective_timeout_s(t.hang_timeout_s, t.first_step_timeout_s),
        disable_tqdm=True,  # MetricsCallback prints one progress line per log event
        # A stream resumes at its recorded row (worker.continue_stream), not by reading the
        # trained rows again.
        ignore_data_skip=cfg.dataset.streaming,
    )
    if on_cpu:
        kwargs.update(
            use_cpu=True,
            ddp_backend="gloo",
            optim="adamw_torch",
            dataloader_pin_memory=False,  # pinning needs an accelerator
        )
    kwargs.update(objective_kwargs(cfg))
    kwargs.update(engine.trainer_kwargs(cfg, run_dir, on_cpu, load_universal))
    return engine.training_arguments(kwargs, cfg, on_cpu, arguments_class(cfg))


def make_trainer(
    cfg: RunConfig, engine: Engine, run_dir: RunDir, plan: PlanRecord, args: Any, model: Any,
    tokenizer: Any, datasets: tuple, resume: str | None, reference: Any = None,
) -> Any:
    """The objective's Trainer (launcher/rank/objective.py) with the launcher's callbacks,
    then any from train.callbacks; `reference`: a DPO run's reference model."""
    from transformers import PrinterCallback

    from launcher.data.loading import collator
    from launcher.rank.callbacks.checkpoint_marker import CheckpointCallback
    from launcher.rank.callbacks.metrics import MetricsCallback
    from launcher.rank.callbacks.tokens import TokenCounter
    from launcher.rank.preempt import PreemptCallback

    metrics = MetricsCallback(run_dir, plan.flops_per_token, plan.peak_flops_per_device, resume)
    train_ds, eval_ds = datasets
    trainer_class, objective_parts = trainer_parts(
        cfg, engine, reference,
        lambda: collator(tokenizer, cfg.dataset.packing, cfg.parallel.sp, cfg.dataset.max_length))
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        **objective_parts,
        callbacks=[*stream_callbacks(cfg, train_ds),
                   CheckpointCallback(cfg.parallel.tp, cfg.parallel.sp),
                   PreemptCallback(run_dir, Supervisor.from_env(os.environ)),
                   *injected_callbacks(cfg)],
    )
    trainer.remove_callback(PrinterCallback)  # it would print the raw log dicts as well
    TokenCounter.install(trainer)  # tokens seen without a collective per micro-batch
    # First in line: the fields it adds to each log reach TensorBoard and metrics.jsonl.
    trainer.callback_handler.callbacks.insert(0, metrics)
    if is_moe(cfg.model) and not is_dpo(cfg):  # TRL's DPOTrainer logs aux_loss itself
        from launcher.rank.callbacks.router_loss import RouterAuxLoss

        RouterAuxLoss.install(trainer)  # ahead of metrics: its field reaches the records
    return trainer


def stream_callbacks(cfg: RunConfig, train_ds: Any) -> list[Any]:
    """Streaming: the position of the first untrained row into each checkpoint."""
    if not cfg.dataset.streaming:
        return []
    from launcher.rank.callbacks.stream_state import StreamState

    return [StreamState(train_ds)]


def injected_callbacks(cfg: RunConfig) -> list[Any]:
    """train.callbacks: {_target_: module.Class, **kwargs} each, built like Hydra does."""
    if not cfg.train.callbacks:
        return []
    from hydra.utils import instantiate

    return [instantiate(dict(spec)) for spec in cfg.train.callbacks]
