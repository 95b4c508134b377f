"""`ftl eval MODEL_DIR|RUN_DIR --tasks T1,T2`, a run's evaluation after training (`ftl train`
with eval.tasks), and `ftl eval --prefetch`. Offline by design: every task is loaded from
the HF cache before any model loads (launcher/data/eval_tasks.py), so a compute node with
no network fails in seconds, naming the task and the prefetch command.

The settings: the run's config.yaml when the model belongs to a run (its eval.*, and
tensorboard in RUN_DIR), else the defaults; the verb's options override eval.*.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.config.compose import compose_config, load_run_config
from launcher.config.schema import EvalConfig, RunConfig
from launcher.data.eval_tasks import OFFLINE_ENV, harness_missing, load_tasks
from launcher.errors import ConfigError
from launcher.evaluation.harness import evaluate, release_device_memory, table
from launcher.evaluation.models import (
    initial_weights,
    load_model,
    model_source,
    saved_chat_template,
)
from launcher.evaluation.processes import (
    evaluate_in_processes,
    gpu_count,
    processes_problem,
    shard_problem,
)
from launcher.evaluation.trackers import log_scores, step_of
from launcher.rundir import CONFIG, EvalDir, EvalSummary, RunDir, new_eval_dir
from launcher.validation.evaluation import eval_key_problems


@dataclass(frozen=True)
class Request:
    """`ftl eval`'s arguments: the dir, and the eval.* values its options set."""

    target: Path
    settings: dict[str, object]
    """eval.* field -> value, from the options given."""
    output: Path | None = None


def ftl_eval(request: Request) -> int:
    """The verb: a run dir evaluates as `ftl train` does after training; a model dir alone."""
    typed_template = request.settings.get("apply_chat_template")
    if (request.target / CONFIG).is_file():
        cfg = _with_settings(load_run_config(request.target / CONFIG), request.settings)
        run_dir = RunDir(request.target)
        template = chat_template_problem(run_dir.model, typed_template)
        evaluate_run(cfg, run_dir, _check(cfg.eval, "ftl eval", "plain", template))
        return 0
    if request.settings.get("before"):
        raise ConfigError(f"--before with {request.target}: the starting weights are known "
                          "for a run only. Fix: ftl eval RUN_DIR --before (the dir holding "
                          "config.yaml), or leave --before out.")
    source = model_source(request.target)
    base = (load_run_config(source.run_dir / CONFIG) if source.run_dir
            else compose_config([]))
    cfg = _with_settings(base, request.settings)
    if source.kind != "plain" and cfg.eval.shard:
        raise ConfigError(f"--shard with {source.path}: ftl loads a {source.kind} model "
                          "itself, on one device. Fix: leave --shard out.")
    tasks = _check(cfg.eval, "ftl eval", source.kind,
                   chat_template_problem(source.path, typed_template))
    cfg = replace(cfg, eval=chat_template_off(cfg.eval, source.path))
    run_dir = RunDir(request.output or source.run_dir
                     or Path(cfg.run.output_dir) / source.path.name)
    eval_dir = new_eval_dir(run_dir)
    model, tokenizer = ((str(source.path), None) if source.by_path
                        else load_model(source, cfg if source.run_dir else None))
    summary = _score(model, tokenizer, tasks, cfg.eval, eval_dir, str(source.path), "model")
    _show(eval_dir.path, summary)
    model_dir = source.path if source.kind != "adapter" else source.path.parent
    log_scores(cfg, run_dir, summary, step_of(run_dir, model_dir.resolve()))
    return 0


def evaluate_run(cfg: RunConfig, run_dir: RunDir,
                 tasks: list[object] | None = None) -> list[EvalSummary]:
    """eval.tasks on a finished run: its model/ (and with eval.before the weights it
    started from, first); each into RUN_DIR/eval/<timestamp>-<label>/, printed. `tasks`:
    already loaded (ftl eval's check loads them), else loaded here."""
    cfg = replace(cfg, eval=chat_template_off(cfg.eval, run_dir.model))
    if tasks is None:
        tasks = load_tasks(cfg.eval.tasks, cfg.eval.include_path)
    summaries = []
    if cfg.eval.before:
        summaries.append(_score_initial(cfg, run_dir, tasks))
        tasks = load_tasks(cfg.eval.tasks, cfg.eval.include_path)  # a Task keeps its run
    eval_dir = new_eval_dir(run_dir, "final")
    summary = _score(str(run_dir.model), None, tasks, cfg.eval, eval_dir,
                     str(run_dir.model), "final")
    summaries.append(_show(eval_dir.path, summary))
    log_scores(cfg, run_dir, summary, step_of(run_dir, run_dir.model))
    if len(summaries) == 2:
        print(before_after(*summaries), flush=True)
    return summaries


def _score_initial(cfg: RunConfig, run_dir: RunDir, tasks: list[object]) -> EvalSummary:
    """eval.before: the starting weights scored, and gone from the device when this returns
    (the final model, or its eval.processes workers, get the GPU to themselves)."""
    eval_dir = new_eval_dir(run_dir, "initial")
    model, tokenizer = initial_weights(cfg, run_dir.path)
    summary = _score(model, tokenizer, tasks, cfg.eval, eval_dir,
                     f"initial ({cfg.model.path or 'built from config'})", "initial")
    del model, tokenizer
    release_device_memory()
    _show(eval_dir.path, summary)
    log_scores(cfg, run_dir, summary, step_of(run_dir, None))
    return summary


def chat_template_problem(model_dir: Path, typed: bool | None) -> str | None:
    """A typed --apply-chat-template for a model whose tokenizer was saved without a chat
    template (a model trained on dataset.format=text, a base model): the harness would fail
    at the first prompt. None when it can run."""
    if not typed or saved_chat_template(model_dir) is not False:
        return None
    return (f"--apply-chat-template with {model_dir}: its tokenizer has no chat template. "
            "Fix: --no-apply-chat-template (prompts as plain text), or a model saved with a "
            "chat template.")


def chat_template_off(ev: EvalConfig, model_dir: Path) -> EvalConfig:
    """eval.apply_chat_template on (the default; a typed one without a template is refused
    by chat_template_problem) for a model saved without a chat template: off, with one
    line."""
    if not ev.apply_chat_template or saved_chat_template(model_dir) is not False:
        return ev
    print(f"ftl eval: {model_dir}'s tokenizer has no chat template: prompts go in as plain "
          "text (eval.apply_chat_template=false).", flush=True)
    return replace(ev, apply_chat_template=False)


def _score(model: Any, tokenizer: Any, tasks: list[object], ev: EvalConfig,
           eval_dir: EvalDir, name: str, label: str) -> EvalSummary:
    """One evaluation: in eval.processes processes for a model dir given by path, else
    here (the starting weights ftl builds itself are one process's)."""
    if ev.processes > 1 and isinstance(model, str):
        return evaluate_in_processes(model, ev, eval_dir, name, label, ev.processes)
    summary = evaluate(model, tokenizer, tasks, ev, eval_dir, name, label)
    assert summary is not None  # one process: the first
    return summary


def before_after(initial: EvalSummary, final: EvalSummary) -> str:
    lines = ["ftl eval: before -> after training:"]
    for task, metrics in final.scores.items():
        for metric, value in metrics.items():
            start = initial.scores.get(task, {}).get(metric)
            if start is not None:
                lines.append(f"  {task} {metric.split(',')[0]}: {start:.3f} -> {value:.3f}")
    return "\n".join(lines)


def prefetch(tasks: list[str], include_path: str) -> int:
    """`ftl eval --prefetch`: load the tasks online, so their data lands in the HF cache;
    print what a compute node needs to read it offline."""
    missing = harness_missing("ftl eval --prefetch")
    if missing or not tasks:
        raise ConfigError([missing or "ftl eval --prefetch: no tasks. Fix: --tasks T1,T2."])
    load_tasks(tasks, include_path, offline=False)
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    env = " ".join(f"{key}={value}" for key, value in OFFLINE_ENV.items())
    print(f"ftl eval: {', '.join(tasks)}: data cached in {home}. On a node with no "
          f"network, with the same cache:\n  export HF_HOME={home} {env}", flush=True)
    return 0


def _with_settings(cfg: RunConfig, settings: dict[str, object]) -> RunConfig:
    given = {key: value for key, value in settings.items() if value is not None}
    return replace(cfg, eval=replace(cfg.eval, **given))


def _check(ev: EvalConfig, what: str, kind: str, template: str | None) -> list[object]:
    """The eval.* rules (eval.processes against this machine's GPUs and the model's
    `kind`; `template`: chat_template_problem's), the harness, and the tasks loaded
    offline: one ConfigError."""
    problems = eval_key_problems(ev) + ([template] if template else [])
    if ev.processes > 1 and (problem := processes_problem(ev, kind, gpu_count())):
        problems.append(problem)
    if ev.shard and (problem := shard_problem(gpu_count())):
        problems.append(problem)
    if not ev.tasks:
        problems.append(f"{what}: no tasks. Fix: --tasks arith (the bundled demo task) or "
                        "harness tasks, e.g. --tasks gsm8k,hellaswag.")
    missing = harness_missing(what)
    if problems or missing:
        raise ConfigError(problems + ([missing] if missing else []))
    return load_tasks(ev.tasks, ev.include_path)


def _show(where: Path, summary: EvalSummary) -> EvalSummary:
    print(f"ftl eval: {summary.model} ({summary.samples} examples, {summary.seconds:.1f} s)"
          f", results in {where}:\n{table_of(where)}", flush=True)
    return summary


def table_of(where: Path) -> str:
    return table(EvalDir(where))
