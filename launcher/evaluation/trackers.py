"""Scores into the run's trackers (train.report_to), beside its training curves, as
`eval_harness/<task>/<metric>` at the step of the weights scored (0 for the starting
weights, the last step for model/, N for checkpoint-N), so before and after are two points
of one curve: TensorBoard in RUN_DIR/tensorboard; wandb and MLflow in the run's own tracker
runs (their ids in RUN_DIR/trackers.json, as a resumed launch continues them: one tracker
run per training run). wandb's steps only grow, so its scores take a step metric of their
own (`eval_harness/step`). A tracker's trouble never fails the evaluation: one line says
what was not logged. Credentials come from the environment, as in training."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.config.report_to import default_mlflow_uri, requested
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


def metrics_of(summary: EvalSummary) -> dict[str, float]:
    return {f"{TAG}/{task}/{metric.split(',')[0]}": value
            for task, metrics in summary.scores.items() for metric, value in metrics.items()}


def log_scores(cfg: RunConfig, run_dir: RunDir, summary: EvalSummary, step: int) -> None:
    names, values = requested(cfg), metrics_of(summary)
    runs = run_dir.read_trackers()
    loggers = [("tensorboard", lambda: _to_tensorboard(run_dir, values, step))]
    if runs is not None and runs.wandb:
        loggers.append(("wandb", lambda: _to_wandb(runs.wandb, run_dir, values, step)))
    if runs is not None and runs.mlflow:
        loggers.append(("mlflow", lambda: _to_mlflow(runs.mlflow, cfg, values, step)))
    for name, log in loggers:
        if name not in names:
            continue
        try:
            log()
        except Exception as error:  # noqa: BLE001 - any tracker failure is only reported
            print(f"ftl eval: the scores were not logged to {name}: {error}", flush=True)


def _to_tensorboard(run_dir: RunDir, values: dict[str, float], step: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(run_dir.tensorboard))
    try:
        for key, value in values.items():
            writer.add_scalar(key, value, step)
    finally:
        writer.close()


def _to_wandb(run_id: str, run_dir: RunDir, values: dict[str, float], step: int) -> None:
    import wandb

    run = wandb.init(id=run_id, resume="allow",
                     project=os.environ.get("WANDB_PROJECT") or "ftlaunch",
                     dir=os.environ.get("WANDB_DIR") or str(run_dir.path))
    try:
        run.define_metric(f"{TAG}/step", hidden=True)
        run.define_metric(f"{TAG}/*", step_metric=f"{TAG}/step")
        run.log({**values, f"{TAG}/step": step})
    finally:
        run.finish()
        wandb.teardown()  # its service process, which would outlive this one


def _to_mlflow(run_id: str, cfg: RunConfig, values: dict[str, float], step: int) -> None:
    import mlflow

    if not mlflow.is_tracking_uri_set():  # MLFLOW_TRACKING_URI unset: training's default
        mlflow.set_tracking_uri(default_mlflow_uri(cfg))
    with mlflow.start_run(run_id=run_id):  # ends FINISHED, as training left it
        mlflow.log_metrics(values, step=step)
