"""The experiment trackers `train.report_to` names, and what each needs before a launch: the
config side of launcher/rank/tracker_runs.py (the ranks log through the HF Trainer's own
integrations). Credentials come from the environment only, never from the config, and ftl
writes them nowhere.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from launcher.config.schema import RunConfig

TRACKERS = ("tensorboard", "wandb", "mlflow")
NONE = "none"
CHOICES = (*TRACKERS, NONE)


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


def tracker_problems(cfg: RunConfig) -> list[str]:
    """A tracker's package missing here, or its credential missing from the environment (a
    Slurm job inherits this environment: sbatch --export=ALL). The environment is read at
    the call, never bound at import: `datasets`' multi-process map replaces the os.environ
    object (arrow_dataset.py: `os.environ = prev_env`)."""
    problems, names = [], requested(cfg)
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    for name in names:
        modules = (name,)
        if name == "mlflow" and (not uri or uri.startswith("sqlite:")):
            # the default store (default_mlflow_uri) or a sqlite one: beyond mlflow-skinny
            modules += ("sqlalchemy", "alembic")
        problems += [_missing(cfg, name, module) for module in modules
                     if importlib.util.find_spec(module) is None]
    # under these modes wandb never talks to a server, so needs no key
    local = os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
    if "wandb" in names and not os.environ.get("WANDB_API_KEY") and not local:
        problems.append(
            f"{typed(cfg)}: wandb logs to its server and WANDB_API_KEY is not set in "
            "this environment (ftl takes credentials from the environment only). Fix: export "
            "WANDB_API_KEY=<your key>, or WANDB_MODE=offline to log locally (`wandb sync` "
            "later), or leave wandb out of train.report_to."
        )
    return problems


def _missing(cfg: RunConfig, name: str, module: str) -> str:
    # wandb and mlflow have an ftlaunch extra of their name (tensorboard is a core
    # dependency); each integration imports the package of its name on rank 0
    extra = name in ("wandb", "mlflow")
    install = f"pip install 'ftlaunch[{name}]'" if extra else f"pip install {module}"
    return (f"{typed(cfg)}: {name} needs the Python package {module}, which is not "
            f"installed in this environment. Fix: {install}, or leave {name} out of "
            "train.report_to.")


def default_mlflow_uri(cfg: RunConfig) -> str:
    """MLflow's store when MLFLOW_TRACKING_URI is unset: sqlite in run.output_dir (made
    absolute at compose), shared by every run and launch under it, so a resume (which
    looks for its checkpoint there too) finds its tracker run. MLflow's own default is
    sqlite in the working directory, which differs between a shell and a batch job."""
    return f"sqlite:///{Path(cfg.run.output_dir) / 'mlflow.db'}"
