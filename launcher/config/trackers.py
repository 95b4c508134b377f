"""The experiment trackers `train.report_to` names, and what each needs before a launch: the
config side of launcher/rank/trackers.py (the ranks log through the HF Trainer's own
integrations). Credentials come from the environment only, never from the config, and ftl
writes them nowhere; preflight.tracker_problems checks this environment with these facts.
"""

from __future__ import annotations

from pathlib import Path

from launcher.config.schema import RunConfig

TRACKERS = ("tensorboard", "wandb", "mlflow")
NONE = "none"
CHOICES = (*TRACKERS, NONE)

SQL_STORE_MODULES = ("sqlalchemy", "alembic")
"""What MLflow's sqlite store needs beyond mlflow-skinny (the default store, below)."""
EXTRAS = ("wandb", "mlflow")
"""The trackers the ftlaunch extra of their name installs (tensorboard is a core dependency).
Each tracker's integration imports the package of its name on rank 0."""

WANDB_LOCAL_MODES = ("offline", "disabled", "dryrun")
"""WANDB_MODE values under which wandb never talks to a server, so needs no key."""


def requested(cfg: RunConfig) -> list[str]:
    """The trackers a run logs to, in the order given, without `none` and repeats."""
    return list(dict.fromkeys(name for name in cfg.train.report_to if name != NONE))


def typed(cfg: RunConfig) -> str:
    """train.report_to as the user types it: train.report_to=[tensorboard,wandb]."""
    return f"train.report_to=[{','.join(cfg.train.report_to)}]"


def name_problems(cfg: RunConfig) -> list[str]:
    names = cfg.train.report_to
    problems = [
        f"{typed(cfg)}: {name!r} is not a tracker. Fix: a list of {', '.join(TRACKERS)}, "
        f"or [{NONE}] to log to none."
        for name in names if name not in CHOICES
    ]
    if NONE in names and len(set(names)) > 1:
        problems.append(f"{typed(cfg)}: {NONE} with other trackers. Fix: "
                        f"train.report_to=[{NONE}] alone, or leave {NONE} out.")
    return problems


def default_mlflow_uri(cfg: RunConfig) -> str:
    """MLflow's store when MLFLOW_TRACKING_URI is unset: sqlite in run.output_dir (made
    absolute at compose), shared by every run and launch under it, so a resume (which
    looks for its checkpoint there too) finds its tracker run. MLflow's own default is
    sqlite in the working directory, which differs between a shell and a batch job."""
    return f"sqlite:///{Path(cfg.run.output_dir) / 'mlflow.db'}"
