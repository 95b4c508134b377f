"""Rules of `eval.*` (benchmarks on lm-evaluation-harness): the values as typed
(`eval_key_problems`, every verb), and for a run that will evaluate (`ftl train` and `ftl
submit` with eval.tasks) that the harness is installed and every task loads offline, so a
missing cache ends the command before any training (`eval_task_problems`). `ftl eval`
applies the same two (launcher/evaluation/)."""

from __future__ import annotations

from pathlib import Path

from launcher.config.schema import EvalConfig, RunConfig
from launcher.data.eval_tasks import harness_missing, load_tasks
from launcher.errors import ConfigError, flagged


def eval_key_problems(ev: EvalConfig) -> list[str]:
    """The eval.* values, each wrong one with its fix."""
    limit = ev.limit
    return flagged([
        (limit is not None and (limit <= 0 or (limit >= 1 and limit != int(limit))),
         f"eval.limit={limit}: a count of examples per task (a whole number >= 1) or a "
         "share in (0, 1). Fix: e.g. eval.limit=100, or leave it empty for all."),
        (ev.num_fewshot is not None and ev.num_fewshot < 0,
         f"eval.num_fewshot={ev.num_fewshot}: must be >= 0. Fix: e.g. eval.num_fewshot=5, "
         "or leave it empty for each task's default."),
        (ev.batch_size < 1,
         f"eval.batch_size={ev.batch_size}: must be >= 1. Fix: e.g. eval.batch_size=16."),
        (bool(ev.include_path) and not Path(ev.include_path).is_dir(),
         f"eval.include_path={ev.include_path}: not a directory. Fix: the directory that "
         "holds your task YAMLs."),
    ])


def eval_rules(cfg: RunConfig) -> list[str]:
    """A run's eval.* values (rules.config_problems: every verb that composes a run)."""
    ev = cfg.eval
    return eval_key_problems(ev) + flagged([(
        ev.before and not ev.tasks,
        "eval.before=true without eval.tasks: nothing to evaluate. Fix: eval.tasks=[arith] "
        "(or your tasks), or leave eval.before out.")])


def eval_task_problems(ev: EvalConfig, what: str) -> list[str]:
    """The harness installed and every task loaded from the HF cache; [] when all load."""
    missing = harness_missing(what)
    if missing:
        return [missing]
    try:
        load_tasks(ev.tasks, ev.include_path)
    except ConfigError as error:
        return error.problems
    return []
