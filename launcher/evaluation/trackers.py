"""Scores into the run's TensorBoard (RUN_DIR/tensorboard, when train.report_to has it),
beside its training curves: `eval_harness/<task>/<metric>` at the step of the weights
scored (0 for the starting weights, the last step for model/, N for checkpoint-N), so
before and after are two points of one curve. wandb and MLflow: not yet (docs/guide.md)."""

from __future__ import annotations

from pathlib import Path

from launcher.config.report_to import requested
from launcher.config.schema import RunConfig
from launcher.rundir import EvalSummary, RunDir

TAG = "eval_harness"


def step_of(run_dir: RunDir, model: Path | None) -> int:
    """The optimizer step of the weights in `model` (None: the starting weights)."""
    if model is None:
        return 0
    if model.name.startswith("checkpoint-") and model.name[11:].isdigit():
        return int(model.name[11:])
    result = run_dir.read_result()
    return result.global_step if result is not None else 0


def log_scores(cfg: RunConfig, run_dir: RunDir, summary: EvalSummary, step: int) -> None:
    if "tensorboard" not in requested(cfg):
        return
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(run_dir.tensorboard))
    try:
        for task, metrics in summary.scores.items():
            for metric, value in metrics.items():
                writer.add_scalar(f"{TAG}/{task}/{metric.split(',')[0]}", value, step)
    finally:
        writer.close()
