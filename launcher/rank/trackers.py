"""Experiment trackers on the ranks (train.report_to): one tracker run per training run,
continued by every launch that resumes it; rank 0 only.

The logging itself is the HF Trainer's own integrations (transformers' TensorBoardCallback,
WandbCallback, MLflowCallback: TrainingArguments, the model config, every log event). This
module adds what makes a tracker run *this* run:

- Identity. Rank 0 opens the tracker runs before `trainer.train()` and records their ids in
  RUN_DIR/trackers.json (`TrackerRuns`). A launch that resumes a checkpoint continues the
  tracker runs recorded in the run dir that holds that checkpoint: a Slurm requeue, this
  run dir; `ftl train` again or another world size, the earlier run dir. A launch that
  starts from step 0 opens new ones (continuing would log its steps a second time).
  wandb: WANDB_RUN_ID + WANDB_RESUME=allow, read by the wandb.init its callback calls.
  MLflow: `mlflow.start_run(run_id=...)` here, so MLflowCallback finds the run active and
  neither starts one nor ends it at train end (it would, and the worker's final eval,
  after train(), would then log into a second, new run).
- The run's facts (callbacks/tracker_params.py): the resolved config, strategy, world
  size and the estimate once per tracker run, and per launch its world size, first step
  and start-up seconds (launcher/timing.py), as wandb config and MLflow params. MLflow
  refuses to change a logged param, so a resumed launch logs only its own
  `ftl.launch.<N>.*` keys, and the integration's TrainingArguments (whose output_dir
  differs per run dir) not again.
- Closing. The worker leaves with os._exit, where no atexit hook runs: `close_runs` ends
  the runs (MLflow flushes its asynchronous logging on end_run) before that.

Credentials (WANDB_API_KEY, MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN) and the tracking URI
are read by the libraries from the environment; nothing here writes them anywhere.
"""

from __future__ import annotations

import os
import secrets
import string
import sys
from pathlib import Path
from typing import Any

from launcher.config.schema import RunConfig
from launcher.config.trackers import default_mlflow_uri, requested
from launcher.rundir import PlanRecord, RunDir, TrackerRuns

OPENED = ("wandb", "mlflow")
"""The trackers whose runs this module opens (TensorBoard writes event files only)."""
WANDB_PROJECT = "ftlaunch"
"""wandb's project unless WANDB_PROJECT says otherwise (the integration's default is
"huggingface")."""


def attach(trainer: Any, cfg: RunConfig, run_dir: RunDir, plan: PlanRecord,
           resume: Path | None) -> None:
    """Rank 0, before trainer.train(): open the tracker runs, add the callback that logs
    the run's facts (after the integrations': they have set up by its on_train_begin)."""
    if not trainer.is_world_process_zero():
        return
    from launcher.rank.callbacks.tracker_params import TrackerParams

    runs = open_runs(cfg, run_dir, resume)
    if runs is not None:
        trainer.add_callback(TrackerParams(cfg, plan, run_dir, runs))


def open_runs(cfg: RunConfig, run_dir: RunDir, resume: Path | None) -> TrackerRuns | None:
    names = [name for name in requested(cfg) if name in OPENED]
    if not names:
        return None
    # checkpoints/checkpoint-N -> its run dir; a checkpoint outside a run dir has no record
    earlier = (RunDir(resume.parent.parent).read_trackers() if resume is not None else None)
    earlier = earlier or TrackerRuns()
    runs = TrackerRuns(
        wandb=_open_wandb(earlier.wandb, run_dir) if "wandb" in names else None,
        mlflow=_open_mlflow(earlier.mlflow, cfg) if "mlflow" in names else None,
        launches=earlier.launches + 1,
    )
    run_dir.write_trackers(runs)
    return runs


def _open_wandb(run_id: str | None, run_dir: RunDir) -> str:
    """The id WandbCallback's wandb.init will use: the resumed one, else the user's
    WANDB_RUN_ID, else a new one, chosen here so that it is recorded before the run exists."""
    if run_id is None:
        run_id = os.environ.get("WANDB_RUN_ID")
    if run_id is None:  # wandb's own form: 8 of [a-z0-9]
        run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits)
                         for _ in range(8))
    os.environ["WANDB_RUN_ID"] = run_id
    os.environ["WANDB_RESUME"] = "allow"  # continue that id if it exists, else create it
    os.environ.setdefault("WANDB_DIR", str(run_dir.path))  # RUN_DIR/wandb/, not the cwd
    os.environ.setdefault("WANDB_PROJECT", WANDB_PROJECT)
    return run_id


def _open_mlflow(run_id: str | None, cfg: RunConfig) -> str:
    import mlflow

    if not mlflow.is_tracking_uri_set():  # MLFLOW_TRACKING_URI unset
        mlflow.set_tracking_uri(default_mlflow_uri(cfg))
    # MLflowCallback would start a run again when it sees MLFLOW_RUN_ID: the active one is it
    user_run = os.environ.pop("MLFLOW_RUN_ID", None)
    resumed = run_id is not None
    run_id = run_id or user_run
    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if run_id is None and experiment:
        mlflow.set_experiment(experiment)  # created if missing
    run = mlflow.start_run(run_id=run_id, run_name=None if run_id else cfg.run.name)
    if resumed:
        # The integration's params (TrainingArguments) were logged by the first launch;
        # MLflow refuses a changed value, and output_dir differs per run dir.
        os.environ["MLFLOW_MAX_LOG_PARAMS"] = "0"
    return str(run.info.run_id)


def close_runs(finished: bool) -> None:
    """Before the worker's os._exit: end the runs this process opened. A launch that stopped
    early (resumable) ends its MLflow run as KILLED; the next launch sets it running again."""
    if (wandb := sys.modules.get("wandb")) is not None and wandb.run is not None:
        wandb.finish()
        wandb.teardown()  # its service process, which would outlive os._exit
    if (mlflow := sys.modules.get("mlflow")) is not None and mlflow.active_run() is not None:
        mlflow.end_run("FINISHED" if finished else "KILLED")
