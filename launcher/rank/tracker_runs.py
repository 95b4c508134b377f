"""Experiment trackers on rank 0 (train.report_to): the HF Trainer's own integrations log;
this module opens the wandb and MLflow runs before `trainer.train()` so every launch that
resumes a run continues its tracker runs (ids in RUN_DIR/trackers.json), logs the run's
facts (`TrackerParams`) and ends the runs before the worker's os._exit (no atexit hook runs
there). The MLflow run is started here, before MLflowCallback sets up, so the callback
neither starts nor ends it: it would end it at train end, and the final eval after
`trainer.train()` would open a second run. A launch from step 0 opens new runs rather than log
its steps twice. What the user sees: docs/guide.md, "Trackers". Credentials stay in the
environment.
"""

from __future__ import annotations

import os
import secrets
import string
import sys
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher import timing
from launcher.config.report_to import default_mlflow_uri, requested
from launcher.config.schema import RunConfig
from launcher.rundir import PlanRecord, RunDir, TrackerRuns


def attach(trainer: Any, cfg: RunConfig, run_dir: RunDir, plan: PlanRecord,
           resume: Path | None) -> None:
    """Rank 0, before trainer.train(): open the tracker runs, add the callback that logs
    the run's facts (after the integrations': they have set up by its on_train_begin)."""
    if not trainer.is_world_process_zero():
        return
    runs = open_runs(cfg, run_dir, resume)
    if runs is not None:
        trainer.add_callback(TrackerParams(cfg, plan, run_dir, runs))


def open_runs(cfg: RunConfig, run_dir: RunDir, resume: Path | None) -> TrackerRuns | None:
    names = [name for name in requested(cfg) if name in ("wandb", "mlflow")]  # not TensorBoard
    if not names:
        return None
    # checkpoints/checkpoint-N -> its run dir; a checkpoint outside a run dir has no record
    earlier = (RunDir(resume.parent.parent).read_trackers() if resume else None) or TrackerRuns()
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
    os.environ.setdefault("WANDB_PROJECT", "ftlaunch")  # the integration's: "huggingface"
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
    remove_wandb_staging()
    if (mlflow := sys.modules.get("mlflow")) is not None and mlflow.active_run() is not None:
        mlflow.end_run("FINISHED" if finished else "KILLED")


WANDB_STAGING = (("wandb.sdk.data_types._private", ("MEDIA_TMP",)),
                 ("wandb.sdk.artifacts.artifact", ("Artifact", "_TMP_DIR")))
"""The temporary directories wandb creates at import (wandb 0.31: tmp*wandb-media,
tmp*wandb-artifacts) and removes only at exit, which os._exit skips: two left in the
system's temp dir by every process that imported it."""


def remove_wandb_staging() -> None:
    """wandb's staging dirs (WANDB_STAGING) removed, where they exist by those names."""
    for module_name, path in WANDB_STAGING:
        found: Any = sys.modules.get(module_name)
        for name in path:
            found = getattr(found, name, None)
        if isinstance(found, tempfile.TemporaryDirectory):
            found.cleanup()


class TrackerParams(TrainerCallback):
    """Rank 0: the run's facts once per tracker run (the config's keys as typed, ftl.*), and
    per launch N (ftl.launch.N.*: MLflow never changes a logged param)."""

    def __init__(self, cfg: RunConfig, plan: PlanRecord, run_dir: RunDir,
                 runs: TrackerRuns) -> None:
        self.cfg, self.plan, self.run_dir, self.runs = cfg, plan, run_dir, runs
        self.prefix = f"ftl.launch.{runs.launches - 1}."
        self.startup_logged = False

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        params: dict[str, Any] = {}
        if self.runs.launches == 1:
            params = run_params(self.cfg, self.plan, args.world_size)
        params[self.prefix + "world_size"] = args.world_size
        params[self.prefix + "start_step"] = state.global_step
        log_params(self.runs, params)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.startup_logged:
            return
        self.startup_logged = True  # this launch's first step: its start-up is complete
        startup = timing.rank_startup(str(self.run_dir.path))
        # `plan+run dir` -> `plan_run_dir`: MLflow refuses `+` in a param name
        log_params(self.runs, {f"{self.prefix}startup.{k.replace('+', '_').replace(' ', '_')}": v
                               for k, v in startup.items()})


def run_params(cfg: RunConfig, plan: PlanRecord, world_size: int) -> dict[str, Any]:
    """The resolved config (dotted keys as typed), strategy, world size and estimate."""
    params = flatten(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))
    params["ftl.strategy"] = plan.strategy or cfg.strategy.name
    params["ftl.world_size"] = world_size
    params.update(flatten(plan.estimate or {}, "ftl.estimate."))
    return params


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}{key}."))
    return out


def log_params(runs: TrackerRuns, params: dict[str, Any]) -> None:
    if runs.wandb is not None:
        import wandb

        if wandb.run is not None:
            wandb.run.config.update(params, allow_val_change=True)
    if runs.mlflow is not None:
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        # Asynchronous, as the integration logs: a tracker's trouble never stops training.
        # MLflow splits the batch into requests it accepts (MAX_PARAMS_TAGS_PER_BATCH).
        mlflow.log_params({key: str(value)[:MAX_PARAM_VAL_LENGTH] for key, value in params.items()},
                          synchronous=False)
