"""A new engine is one class: a strategy YAML names it, and ftlaunch plans, validates,
estimates and launches it with no change to launcher/ (issue 21).

train.compile=true under DDP (2 CPU ranks, 2 steps) is `make test-full`'s launch: both
steps' losses equal the eager ddp run's (test_train_strategies.py's reference; measured
equal to the last digit, asserted at rel 1e-5), and the start-up line has its `compile`
phase. Its cold inductor cache costs ~25 s of a 2-core CI machine; `make test` keeps the
twins that catch a broken switch: tests/unit/test_speed_switches.py (torch_compile reaches
TrainingArguments; dynamo's compile-time count, which the phase reads, is there and moves)
and tests/unit/test_timing.py (the phase is split off the first step)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_engine import EXTRA_BYTES, SETTINGS_FILE
from runs import RUN_TIMES, Run, describe_failure, train
from test_train_strategies import run_name, strategy_overrides

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
    site_strategy: Callable[[str], Path], runs_root: Path, trained: Callable[..., Run],
) -> None:
    eager = trained(run_name("ddp", "torchrun", "fp32"),  # before the site's config dir
                    strategy_overrides("ddp", "torchrun", "fp32"))
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
    RUN_TIMES["fake-engine (2 steps)"] = run.seconds
    assert json.loads((run.run_dir / SETTINGS_FILE).read_text()) == plan.settings
    for rank in (0, 1):  # every rank ran the engine's own hook on the written settings
        probe = json.loads((run.run_dir / "probes" / f"fake-engine-rank{rank}.json").read_text())
        assert probe == plan.settings
    assert run.result["global_step"] == 2
    assert (run.run_dir / "model" / "config.json").exists()
    expected = eager.train_losses()  # a DdpEngine subclass trains as ddp does
    assert run.train_losses() == pytest.approx({step: expected[step] for step in (1, 2)}, rel=1e-5)


@pytest.mark.full
def test_compile_trains_like_eager(runs_root: Path, trained: Callable[..., Run]) -> None:
    eager = trained(run_name("ddp", "torchrun", "fp32"),
                    strategy_overrides("ddp", "torchrun", "fp32"))
    run = train(runs_root, "compiled", ["strategy=ddp", "train.max_steps=2",
                                        "train.save_steps=2", "train.eval_on_start=false",
                                        "train.compile=true"])
    assert run.returncode == 0, describe_failure(run)
    RUN_TIMES["compiled (train.compile=true, 2 steps)"] = run.seconds
    assert_compiled_like_eager(run, eager)


def assert_compiled_like_eager(run: Run, eager: Run) -> None:
    """torch.compile changes no loss: step 1 checks the compiled forward, step 2 also its
    backward and the optimizer step it fed. The compile's seconds are a start-up phase."""
    assert eager.returncode == 0, describe_failure(eager)
    compiled, expected = run.train_losses(), eager.train_losses()
    assert sorted(compiled) == [1, 2]
    for step, loss in compiled.items():
        assert loss == pytest.approx(expected[step], rel=1e-5), (step, compiled, expected)
    (startup,) = [m["startup"] for m in run.metrics() if m.get("event") == "startup"]
    assert startup["compile"] > 0 and list(startup)[-2:] == ["compile", "first step"], startup
