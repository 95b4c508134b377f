"""Rules of `eval.*` (benchmarks on lm-evaluation-harness): the values as typed
(`eval_key_problems`, every verb), and for a run that will evaluate (`ftl train` and `ftl
submit` with eval.tasks) that the harness is installed and every task loads offline, so a
missing cache ends the command before any training (`eval_task_problems`). `ftl eval`
applies the same two (launcher/evaluation/)."""

from __future__ import annotations

from pathlib import Path

from launcher.config.hardware import GPU_PRESETS, is_gpu_preset
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
        (ev.processes < 1,
         f"eval.processes={ev.processes}: must be >= 1. Fix: eval.processes=1, or the "
         "number of the node's GPUs to evaluate on."),
        (ev.processes > 1 and ev.shard,
         f"eval.processes={ev.processes} with eval.shard=true: one model split over the GPUs "
         "is one process. Fix: one of them (processes for a model that fits one GPU)."),
        (bool(ev.include_path) and not Path(ev.include_path).is_dir(),
         f"eval.include_path={ev.include_path}: not a directory. Fix: the directory that "
         "holds your task YAMLs."),
    ])


def eval_rules(cfg: RunConfig) -> list[str]:
    """A run's eval.* values (rules.config_problems: every verb that composes a run)."""
    ev, cluster = cfg.eval, cfg.cluster
    n = ev.processes
    preset = GPU_PRESETS.get(cluster.gpu)  # an unknown name: the cluster rules say so
    on_cpu = preset is not None and preset.is_cpu
    return eval_key_problems(ev) + flagged([
        (ev.before and not ev.tasks,
         "eval.before=true without eval.tasks: nothing to evaluate. Fix: eval.tasks=[arith] "
         "(or your tasks), or leave eval.before out."),
        (n > 1 and on_cpu,
         f"eval.processes={n} with cluster.gpu={cluster.gpu}: the harness splits examples "
         "only across GPUs (on CPU each process would score every example). Fix: "
         "eval.processes=1."),
        (ev.shard and on_cpu,
         f"eval.shard=true with cluster.gpu={cluster.gpu}: the harness splits a model over "
         "GPUs only (on CPU it fails at the first batch). Fix: leave eval.shard out."),
        (n > 1 and is_gpu_preset(cluster.gpu) and n > cluster.gpus_per_node,
         f"eval.processes={n}: more than the node's cluster.gpus_per_node="
         f"{cluster.gpus_per_node} GPUs. Fix: eval.processes={cluster.gpus_per_node}."),
    ])


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
