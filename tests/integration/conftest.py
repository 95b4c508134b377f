"""Fixtures for real multi-process training runs (2 ranks, gloo, tiny Llama, bundled data).

Runs are cached per session by name, so a test that needs an uninterrupted reference run
(resume) reuses the one the strategy test already trained. Every run's wall time is
printed in the terminal summary (a figure to report, not an assertion).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from runs import RUN_TIMES, Run, train  # noqa: E402

from launcher.config.compose import PROJECT_ROOT  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def bundled_assets() -> None:
    for needed in ("assets/tokenizer", "data/arith/train.jsonl", "data/arith/eval.jsonl"):
        if not (PROJECT_ROOT / needed).exists():
            pytest.fail(f"{needed} is missing from the checkout (make data)")


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def trained(runs_root: Path) -> Callable[..., Run]:
    """trained(name, overrides) -> Run: launches once per name per session, so tests that
    need the same run (e.g. a reference for resume) share it."""
    cache: dict[str, Run] = {}

    def get(name: str, overrides: list[str]) -> Run:
        if name not in cache:
            cache[name] = train(runs_root, name, overrides)
            RUN_TIMES[name] = cache[name].seconds
        return cache[name]

    return get


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RUN_TIMES:
        return
    terminalreporter.section("training run wall times (2 ranks, 8 steps, incl. startup)")
    for name, seconds in sorted(RUN_TIMES.items()):
        terminalreporter.write_line(f"{name:52s} {seconds:6.1f} s")


@pytest.fixture(scope="session")
def pretrained_dir(
    trained: Callable[..., Run], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A small pretrained Llama checkpoint that the suite trains itself: the model/ dir
    (save_pretrained + tokenizer) of the plain DDP run that test_train_strategies.py
    already does (same name and overrides, so the session trains it once), copied to
    <tmp>/model. That run's result.json is copied next to it (<tmp>/result.json): its
    final_eval_loss is the checkpoint's own eval loss, its first_eval_loss a fresh init's."""
    import shutil

    from runs import EVIDENCE, callbacks, describe_failure

    run = trained(
        "ddp-torchrun-fp32",  # = test_train_strategies.run_name("ddp", "torchrun", "fp32")
        ["strategy=ddp", "cluster.launcher=torchrun", "precision=fp32", callbacks(*EVIDENCE)],
    )
    if run.returncode != 0:
        pytest.fail(f"the run that makes the pretrained checkpoint failed: {describe_failure(run)}")
    root = tmp_path_factory.mktemp("pretrained")
    shutil.copytree(run.run_dir / "model", root / "model")
    shutil.copy2(run.run_dir / "result.json", root / "result.json")
    return root / "model"
