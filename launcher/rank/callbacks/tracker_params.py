"""The run's facts as tracker params (rank 0), into the wandb and MLflow runs that
launcher/rank/trackers.py opened: once per tracker run the resolved config (its keys as
typed: train.lr), strategy, world size and estimate (ftl.*); per launch N its world size,
first step and start-up seconds (ftl.launch.N.*: MLflow never changes a logged param)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher import timing
from launcher.config.schema import RunConfig
from launcher.rundir import PlanRecord, RunDir, TrackerRuns


class TrackerParams(TrainerCallback):
    """Rank 0: the run's facts into the tracker runs `open_runs` opened."""

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
        log_params(self.runs, {f"{self.prefix}startup.{param_name(k)}": v
                               for k, v in startup.items()})


def param_name(phase: str) -> str:
    """A start-up phase as a key both trackers take: `plan+run dir` -> `plan_run_dir`
    (MLflow refuses `+` in a param name)."""
    return phase.replace("+", "_").replace(" ", "_")


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
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        items = [(key, str(value)[:MAX_PARAM_VAL_LENGTH]) for key, value in params.items()]
        for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            # asynchronous, as the integration logs: a tracker's trouble never stops training
            mlflow.log_params(dict(items[start:start + MAX_PARAMS_TAGS_PER_BATCH]),
                              synchronous=False)
