"""train.report_to: refused before launch with the fix (an unknown name, none with others, a
missing package, wandb without a key), and the tracker run a launch continues: the one
recorded in the run dir of the checkpoint it resumes, else a new one. The runs themselves
(wandb offline, MLflow's store, one run across a stop and a resume) are checked on a real
stopped and resumed run: tests/integration/test_graceful_stop.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose_config
from launcher.errors import ConfigError
from launcher.rundir import RunDir, TrackerRuns
from launcher.validation.validate import validate

TRACKER_ENV = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR",
               "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the user's tracker settings; whatever a test's code sets is undone after."""
    for name in TRACKER_ENV:
        monkeypatch.delenv(name, raising=False)


def train_problems(tmp_path: Path, report_to: str) -> list[str]:
    cfg = compose_config([f"run.output_dir={tmp_path}", f"train.report_to={report_to}"])
    try:
        validate(cfg, "train")
    except ConfigError as error:
        return error.problems
    return []


def test_an_unknown_tracker_and_none_beside_others_are_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(["train.report_to=[tensorboard,neptune]"]), "plan")
    (problem,) = caught.value.problems
    assert "train.report_to=[tensorboard,neptune]: 'neptune' is not a tracker" in problem
    assert "Fix: a list of tensorboard, wandb, mlflow, or [none]" in problem
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(["train.report_to=[none,wandb]"]), "plan")
    assert "Fix: train.report_to=[none] alone" in caught.value.problems[0]
    assert validate(compose_config(["train.report_to=[none]"]), "plan")
    with pytest.raises(ConfigError, match=r"is a list. Fix: train.report_to=\[wandb\]"):
        compose_config(["train.report_to=wandb"])


def test_wandb_needs_a_key_from_the_environment_unless_it_logs_locally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (problem,) = train_problems(tmp_path, "[tensorboard,wandb]")
    assert "train.report_to=[tensorboard,wandb]: wandb logs to its server and WANDB_API_KEY " \
           "is not set" in problem
    assert "Fix: export WANDB_API_KEY=" in problem and "WANDB_MODE=offline" in problem
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert train_problems(tmp_path, "[wandb]") == []
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert train_problems(tmp_path, "[wandb]") == []


def test_a_missing_tracker_package_is_refused_with_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    # a None entry in sys.modules makes the package absent to importlib, as uninstalled
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    problems = train_problems(tmp_path, "[wandb,mlflow]")
    assert len(problems) == 2, problems
    assert "wandb needs the Python package wandb" in problems[0]
    assert "Fix: pip install 'ftlaunch[wandb]'" in problems[0]
    assert "Fix: pip install 'ftlaunch[mlflow]'" in problems[1]


def test_mlflows_default_sqlite_store_needs_sqlalchemy_a_tracking_uri_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    (problem,) = train_problems(tmp_path, "[mlflow]")
    assert "needs the Python package sqlalchemy" in problem and "ftlaunch[mlflow]" in problem
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert train_problems(tmp_path, "[mlflow]") == []


def test_a_dry_run_submit_shows_tracker_problems_as_warnings(tmp_path: Path) -> None:
    cfg = compose_config(["cluster=slurm", "cluster.gpu=cpu", f"run.output_dir={tmp_path}",
                          "train.report_to=[wandb]"])
    checked = validate(cfg, "submit", dry_run=True)
    assert any("WANDB_API_KEY is not set" in warning for warning in checked.warnings)


def test_a_resumed_launch_continues_the_tracker_run_of_its_checkpoints_run_dir(
    tmp_path: Path,
) -> None:
    from launcher.rank.tracker_runs import open_runs

    cfg = compose_config(["train.report_to=[tensorboard,wandb]"])
    first = RunDir(tmp_path / "first")
    first.path.mkdir()
    runs = open_runs(cfg, first, resume=None)
    assert runs is not None and runs.wandb and runs.launches == 1 and runs.mlflow is None
    assert first.read_trackers() == runs
    # `ftl train` again (a new run dir) or a requeue: the checkpoint's run dir names the run
    second = RunDir(tmp_path / "second")
    second.path.mkdir()
    again = open_runs(cfg, second, resume=first.checkpoints / "checkpoint-4")
    assert again == TrackerRuns(wandb=runs.wandb, launches=2)
    assert second.read_trackers() == again
    assert os.environ["WANDB_RUN_ID"] == runs.wandb and os.environ["WANDB_RESUME"] == "allow"
    # a checkpoint from outside any run dir, or none: a new tracker run
    os.environ.pop("WANDB_RUN_ID")
    fresh = open_runs(cfg, second, resume=tmp_path / "elsewhere" / "checkpoint-4")
    assert fresh is not None and fresh.wandb != runs.wandb and fresh.launches == 1
    assert open_runs(compose_config(["train.report_to=[tensorboard]"]), second, None) is None


def test_the_environment_is_read_when_checked_not_when_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """datasets' Dataset.map(num_proc=N) replaces the os.environ object with a copy
    (arrow_dataset.py: `os.environ = prev_env`); a check bound to the old one at import
    would miss every variable set afterwards (this suite's order once did exactly that)."""
    import copy

    monkeypatch.setattr(os, "environ", copy.deepcopy(os.environ))
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert train_problems(tmp_path, "[wandb]") == []
