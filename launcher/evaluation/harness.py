"""One evaluation on lm-evaluation-harness: the model wrapped as the harness's HFLM,
`simple_evaluate` over already loaded tasks, and its output in RUN_DIR/eval/<timestamp>/:
the harness's results.json as it reports them, one samples_<task>.jsonl per task (prompt,
answer, target, score of every example) and ftl's summary.json (EvalSummary). The printed
table is the harness's own (`make_table`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from launcher.config.schema import EvalConfig
from launcher.data.eval_tasks import hub_offline
from launcher.engines.pretrained import NO_HUB_KERNELS
from launcher.rundir import EvalDir, EvalSummary

INSTANCE_WARNINGS = ("`pretrained` model kwarg is not of type `str`",
                     "Passed an already-initialized model through `pretrained`")
"""What HFLM warns whenever it is given a loaded model, as ftl does for its own formats."""


def quiet_harness() -> None:
    """The harness logs every task folder and request at INFO: the console keeps its table,
    and its warnings less the two about a loaded model; and git's complaint outside a
    checkout (quiet_git_hash)."""
    import lm_eval.evaluator

    for name in ("lm_eval", "lm-eval"):
        logging.getLogger(name).setLevel(logging.WARNING)
    hf = logging.getLogger("lm_eval.models.huggingface")
    if not any(isinstance(f, _LoadedModelFilter) for f in hf.filters):
        hf.addFilter(_LoadedModelFilter())
    lm_eval.evaluator.get_git_commit_hash = quiet_git_hash


def quiet_git_hash() -> str | None:
    """What the harness records as results.json's git_hash (`git describe --always` in the
    working directory, else the hash its .git holds), without the "fatal: not a git
    repository" that the harness lets git print after the scores wherever ftl eval runs
    outside a checkout (lm-eval #1691, open upstream since 2024)."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.strip()
    except OSError:  # no git on this machine
        pass
    return get_commit_from_path(os.getcwd())


class _LoadedModelFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(INSTANCE_WARNINGS)


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def release_device_memory() -> None:
    """What a model no longer referenced left on the GPU: freed objects, the allocator's
    cached blocks returned (nothing to do where CUDA never started)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def harness_model(model: Any, tokenizer: Any, ev: EvalConfig) -> Any:
    """The harness's HFLM: a model dir's path (the harness loads, shards with eval.shard,
    splits examples under `accelerate launch`), or a model ftl loaded, moved to the device."""
    from lm_eval.models.huggingface import HFLM

    if isinstance(model, (str, Path)):
        placement: dict[str, Any] = {"parallelize": True} if ev.shard else {"device": device()}
        return HFLM(pretrained=str(model), batch_size=ev.batch_size, dtype="auto", **placement,
                    **NO_HUB_KERNELS)
    return HFLM(pretrained=model.to(device()), tokenizer=tokenizer, batch_size=ev.batch_size)


def run_harness(lm: Any, tasks: list[Any], ev: EvalConfig) -> dict[str, Any] | None:
    """simple_evaluate with eval.*'s settings; None on every process but the first. The
    tasks come loaded: an empty TaskManager, or simple_evaluate would scan the harness's
    own ~200 task folders again (3-4 s) only to pass them through."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import simple_parse_args_string

    limit = ev.limit if ev.limit is None or ev.limit < 1 else int(ev.limit)
    return simple_evaluate(
        model=lm, tasks=tasks, num_fewshot=ev.num_fewshot, limit=limit,
        batch_size=ev.batch_size, apply_chat_template=ev.apply_chat_template,
        gen_kwargs=simple_parse_args_string(ev.gen_kwargs) if ev.gen_kwargs else None,
        log_samples=True, task_manager=TaskManager(include_defaults=False),
    )


def evaluate(model: Any, tokenizer: Any, tasks: list[Any], ev: EvalConfig,
             eval_dir: EvalDir, name: str, label: str) -> EvalSummary | None:
    """Score `model` (a dir's path, or a loaded model with its tokenizer) on `tasks`, write
    the eval dir; the summary (None on processes other than the first)."""
    quiet_harness()
    started = time.monotonic()
    with hub_offline():  # a local model: nothing to fetch, and no hub call to time out
        results = run_harness(harness_model(model, tokenizer, ev), tasks, ev)
    if results is None:
        return None
    summary = EvalSummary(
        model=name, label=label, tasks=list(ev.tasks), scores=scores(results),
        samples=sum(int(n.get("effective", 0)) for n in results.get("n-samples", {}).values()),
        seconds=round(time.monotonic() - started, 2),
    )
    write_results(results, eval_dir)
    eval_dir.write_summary(summary)
    return summary


def scores(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """task (and group) -> metric -> value (the harness's `metric,filter` keys), without
    the standard errors and counts such as sample_len."""
    table = {**results.get("results", {}), **results.get("groups", {})}
    return {task: {key: float(value) for key, value in metrics.items()
                   if isinstance(value, (int, float)) and "," in key and "_stderr" not in key}
            for task, metrics in table.items()}


def write_results(results: dict[str, Any], eval_dir: EvalDir) -> None:
    from lm_eval.utils import handle_non_serializable

    samples = results.pop("samples", {})
    for task, rows in samples.items():
        lines = [json.dumps(row, default=handle_non_serializable) for row in rows]
        eval_dir.samples(task).write_text("\n".join(lines) + "\n")
    eval_dir.results.write_text(
        json.dumps(results, indent=2, default=handle_non_serializable) + "\n")


def table(eval_dir: EvalDir) -> str:
    """The harness's results table (and its groups'), from the written results.json."""
    from lm_eval.utils import make_table

    results = json.loads(eval_dir.results.read_text())
    text = make_table(results)
    if results.get("groups"):
        text += "\n" + make_table(results, "groups")
    return text.rstrip("\n")
