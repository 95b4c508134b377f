"""The per-rank entrypoint: `python -m launcher.rank.worker RUN_DIR`, the recipe
(docs/design.md, "The ranks"). It reads ONLY the run dir and the tokenized data its plan
names. Nothing here exists for tests: they inject their probes through `train.callbacks`.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import torch.distributed as dist

from launcher import timing
from launcher.config.compose import load_run_config
from launcher.config.hardware import gpu_preset
from launcher.config.schema import RunConfig
from launcher.data.encode import adopt_chat_template
from launcher.data.preprocess import rank_datasets
from launcher.data.tokenizer import load_tokenizer
from launcher.engines import engine_of
from launcher.engines.base import Engine
from launcher.errors import DataError
from launcher.rank import imports, memtrace
from launcher.rank.model import apply_peft, build_model
from launcher.rank.objective import reference_model
from launcher.rank.startup import collective_timeout, join_world
from launcher.rank.training import keep_freed_memory, make_trainer, training_arguments
from launcher.rank.watchdog import exit_now as exit_without_teardown
from launcher.rank.watchdog import start_watchdog
from launcher.rundir import STREAM_STATE, PlanRecord, RunDir, RunResult, read_stream_state
from launcher.rundir.checkpoints import checkpoint_step, checkpoint_to_load


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m launcher.rank.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = RunDir(Path(args[0]).resolve())
    engine: Engine | None = None
    try:
        cfg = load_run_config(run_dir.config)
        engine = engine_of(cfg.strategy)
        train(run_dir, cfg, engine)
    except BaseException:
        write_error(run_dir, traceback.format_exc())
        raise
    finally:
        if engine is not None:
            engine.release_rank()
    return 0


def train(run_dir: RunDir, cfg: RunConfig, engine: Engine) -> NoReturn:
    on_cpu = gpu_preset(cfg.cluster.gpu).is_cpu
    engine.enter_rank(cfg)
    rank = int(os.environ.get("RANK", "0"))
    plan = run_dir.read_plan()  # once: the data, the FLOPs figures, the predicted peak
    data_dir = Path(plan.data_dir)
    imports.import_stack(cfg, engine)  # start-up phases: the imports on their own
    memtrace.start(on_cpu, cfg.train.cpu_live_bytes)  # from before the model exists
    from transformers.utils import logging as hf_logging  # after import_stack
    # Bars from every rank garble the launcher's console; MetricsCallback reports the steps.
    hf_logging.disable_progress_bar()
    tokenizer = adopt_chat_template(load_tokenizer(cfg), cfg.dataset)
    # Before the process group exists: ranks waiting for rank 0's tokenization poll the
    # disk, so no collective can time out however long it takes.
    datasets = rank_datasets(cfg, data_dir, tokenizer, rank, run_dir.rank_error("0"))
    timing.mark("data_loaded")
    # From here a rank without progress ends with its stacks (the process group's set-up
    # and the first step are under train.first_step_timeout_s).
    watchdog = start_watchdog(run_dir, cfg.train.hang_timeout_s,
                              cfg.train.first_step_timeout_s, on_gpu=not on_cpu,
                              cleanup=engine.release_rank)
    resume = checkpoint_to_load(cfg.run.resume, run_dir)
    if cfg.dataset.streaming:
        continue_stream(datasets[0], resume)
    load_from, universal = engine.checkpoint_for_world(cfg, run_dir, resume)
    # within cluster.startup_timeout_s; accelerate uses this group
    join_world(cfg, run_dir, engine.process_group_backend(on_cpu))
    if on_cpu:
        keep_freed_memory()
    accelerator_config = engine.setup_distributed(cfg, on_cpu)  # where accelerate errs on CPU
    if cfg.dataset.streaming:  # every rank reads the stream: rows of any width, no broadcast
        accelerator_config = {**accelerator_config, "dispatch_batches": False}
    args = training_arguments(cfg, engine, run_dir, on_cpu, accelerator_config, resume is not None,
                              load_universal=universal)
    collective_timeout(args.ddp_timeout)  # the start-up bound ends here
    timing.mark("args_ready")
    # Built after TrainingArguments: under ZeRO-3 transformers then constructs the model
    # inside deepspeed.zero.Init, so every rank holds only its partition from the start.
    memtrace.PHASES.phase("model")
    model = apply_peft(build_model(cfg, engine, tokenizer), cfg)
    # before the Trainer wraps it and loads the checkpoint (ZeRO-3's leaf modules, experts)
    engine.prepare_model(cfg, model, load_from)
    reference = reference_model(cfg, engine, tokenizer, args)  # DPO's, when one is held
    if reference is not None:
        engine.prepare_model(cfg, reference)  # the initial weights: nothing to resume
    timing.mark("model_built")
    memtrace.PHASES.phase("engine")  # the Trainer, the engine, up to the first step
    resume_text = str(resume) if resume else None
    trainer = make_trainer(cfg, engine, run_dir, plan, args, model, tokenizer, datasets,
                           resume_text, reference)
    for callback in engine.callbacks(universal):
        trainer.add_callback(callback)
    if watchdog is not None:  # first in line: its beat at a step end comes before any other's
        from launcher.rank.callbacks.progress import ProgressBeat  # after import_stack

        trainer.callback_handler.callbacks.insert(0, ProgressBeat(watchdog))
    timing.mark("trainer_built")
    if resume is not None:
        print(f"[ftl] rank {args.process_index}: resuming from {resume}", flush=True)
    from launcher.rank.preempt import stop_on_signals  # after import_stack: it imports transformers
    from launcher.rank.tracker_runs import attach

    attach(trainer, cfg, run_dir, plan, resume)  # rank 0: wandb/mlflow runs, continued
    stop_on_signals()  # SIGTERM/SIGINT from here on: save at a step boundary, then stop
    trainer.train(resume_from_checkpoint=str(load_from) if load_from else None)
    conclude(trainer, cfg, engine, run_dir, plan, resume)


def conclude(trainer: Any, cfg: RunConfig, engine: Engine, run_dir: RunDir, plan: PlanRecord,
             resume: Path | None) -> NoReturn:
    """After trainer.train(): a stopped run leaves its checkpoint to resume from; a finished
    one its final eval, model/, memory record and result.json."""
    from launcher.rank.tracker_runs import close_runs

    timing.mark("train_end")
    if trainer.state.global_step < trainer.state.max_steps:
        # Stopped early (preemption, a stop request): the last complete checkpoint is the
        # state to continue from; the final eval and model belong to the finished run.
        print(f"[ftl] stopped at step {trainer.state.global_step}; resume continues", flush=True)
        close_runs(finished=False)
        finish(engine)
    memtrace.PHASES.phase("final")  # final eval and the final model's save
    final_eval = final_evaluation(trainer)
    timing.mark("final_eval")
    model_dir = engine.save_final_model(trainer, cfg, run_dir.model)
    timing.mark("saved")
    from launcher.rank.callbacks.metrics import record_finish

    record_finish(trainer)
    memory = memtrace.record_memory(trainer, run_dir, plan)  # every rank: a collective
    start_step = (checkpoint_step(resume) or 0) if resume is not None else 0
    result = collect_result(trainer, final_eval, str(resume) if resume else None, start_step,
                            model_dir, memory)
    if trainer.is_world_process_zero():
        run_dir.write_result(result)
        print(f"[ftl] done: model saved to {model_dir}", flush=True)
    close_runs(finished=True)
    finish(engine)


def continue_stream(rows: Any, resume: Path | None) -> None:
    """A streaming run resumed: read on from the checkpoint's recorded position."""
    if resume is None:
        return
    state = read_stream_state(resume)
    if state is None:
        raise DataError(
            f"{resume} holds no stream position ({STREAM_STATE}): it was not saved by a "
            "streaming run. Fix: resume it without dataset.streaming, or start a new run "
            "(run.resume=never)")
    rows.load(state)
    print(f"[ftl] streaming from row {state['rows']} (pass {state['epoch']})", flush=True)


def finish(engine: Engine) -> NoReturn:
    """Leave once every file is written: a barrier (not cut short: rank 0 may still save a
    large model), the engine's per-rank resources, then os._exit from inside train():
    returning freed the trainer, whose gloo group twice deadlocked in its destructor with
    result.json written (docs/evidence/stack.md)."""
    if dist.is_available() and dist.is_initialized():
        faulthandler.dump_traceback_later(600.0)  # a stuck barrier's stacks go to stderr
        dist.barrier()
        faulthandler.cancel_dump_traceback_later()
    engine.release_rank()
    exit_now(0)


def final_evaluation(trainer: Any) -> dict[str, float]:
    """Eval metrics at the last step: the Trainer's own when eval_steps already ran one
    there (it evaluates at the end of a step-based schedule), else one evaluate() now."""
    if trainer.eval_dataset is None:
        return {}
    for entry in reversed(trainer.state.log_history):
        if "eval_loss" in entry and entry.get("step") == trainer.state.global_step:
            return entry
    return trainer.evaluate()


def collect_result(
    trainer: Any, final_eval: dict[str, float], resume: str | None, start_step: int,
    model_dir: Path, memory: dict[str, Any] | None,
) -> RunResult:
    """The finished run in a few numbers, for the user and `ftl status` (rank 0 writes it)."""
    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    return RunResult(
        global_step=trainer.state.global_step, world_size=trainer.args.world_size,
        resumed_from=resume, start_step=start_step,
        first_train_loss=losses[0] if losses else None,
        final_train_loss=losses[-1] if losses else None,
        first_eval_loss=evals[0] if evals else None,
        final_eval_loss=final_eval.get("eval_loss"),
        tokens_seen=int(trainer.state.num_input_tokens_seen or 0),
        model_dir=str(model_dir), memory=memory,
    )


def write_error(run_dir: RunDir, text: str) -> None:
    """logs/rank<R>.error: the launcher names the failed rank and points here."""
    try:
        run_dir.logs.mkdir(parents=True, exist_ok=True)
        run_dir.rank_error(os.environ.get("RANK", "0")).write_text(text)
    except OSError:
        pass  # the traceback still reaches stderr via the re-raise


def exit_now(code: int) -> None:
    """Leave without interpreter teardown once everything is written: teardown can still
    abort (SIGABRT with DeepSpeed on gloo, docs/evidence/stack.md), failing a finished run."""
    logging.shutdown()
    exit_without_teardown(code)


if __name__ == "__main__":
    exit_now(main())
