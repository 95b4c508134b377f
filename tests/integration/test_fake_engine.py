"""A new engine is one class: a strategy YAML names it, and ftlaunch plans, validates,
estimates and launches it with no change to launcher/ (issue 21)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_engine import EXTRA_BYTES, SETTINGS_FILE
from runs import describe_failure, train

from launcher.config.compose import compose_config
from launcher.errors import ConfigError
from launcher.estimator.estimate import estimate
from launcher.run.planner import make_plan
from launcher.validation.validate import validate

FAKE_STRATEGY = """\
name: fake_ddp
backend: tests.integration.fake_engine:FakeEngine
"""


def test_a_new_engine_is_planned_validated_estimated_and_launched(
    site_strategy: Callable[[str], Path], runs_root: Path,
) -> None:
    site_strategy(FAKE_STRATEGY)
    fake = ["strategy=fake_ddp", "cluster.gpus_per_node=2"]
    with pytest.raises(ConfigError) as refused:  # its rule and the launcher rule, together
        validate(compose_config([*fake, "strategy.bucket_size=13",
                                 "cluster.launcher=deepspeed"]), "plan")
    assert "the fake engine refuses 13" in str(refused.value)
    assert "the fake engine is started by torchrun only" in str(refused.value)

    est = estimate(compose_config(fake))
    ddp, own = est.row("ddp"), est.row("fake_ddp")
    assert own is not None and ddp is not None
    assert own.peak_bytes == ddp.peak_bytes + EXTRA_BYTES

    plan = make_plan(validate(compose_config(fake), "plan"))
    assert plan.settings_file == SETTINGS_FILE
    assert plan.settings == {"engine": "fake", "world_size": 2}

    run = train(runs_root, "fake-engine", ["strategy=fake_ddp", "train.max_steps=2",
                                            "train.save_steps=2", "train.eval_on_start=false"])
    assert run.returncode == 0, describe_failure(run)
    assert json.loads((run.run_dir / SETTINGS_FILE).read_text()) == plan.settings
    for rank in (0, 1):  # every rank ran the engine's own hook on the written settings
        probe = json.loads((run.run_dir / "probes" / f"fake-engine-rank{rank}.json").read_text())
        assert probe == plan.settings
    assert run.result["global_step"] == 2
    assert (run.run_dir / "model" / "config.json").exists()
