"""Crash safety under kill -9 (scripts/chaos.sh): kills of a real `ftl train` run at
random moments once each launch has a complete checkpoint of its own, a third of them in
the middle of a later checkpoint's save (counted only if that save is still unfinished
after the kill) and some of a single rank, each followed by a relaunch with
run.resume=auto; then relaunches until the run finishes. `make test` makes 2 kills (one
rank, then mid-save) of a 100-step run; `make test-full` 20 kills (every kind, whole-tree
kills at random moments among them) of an 800-step run. Every launch must start at the
newest complete checkpoint, so each later than the one before (no kill lands before its
launch's first checkpoint, however loaded the machine; 100 steps leave the second launch
room to be caught in a save: at 40 a fresh-clone CI run finished first, measured
2026-12-06), and the final model's logits must
equal an uninterrupted run's (atol 1e-5; fp32 ddp on CPU resumes bitwise, so the measured
difference is 0). `make test`'s run is the tiny mixture of experts (ddp's MoE run: the
router's loss joins each step's and is logged beside it) on a two-source mixture streamed
(dataset.streaming, blocks of 64 rows, passes of ~400 rows: the run reads two): each
relaunch reads on from the row its checkpoint recorded (launcher/data/stream.py), so the
final logits equal the reference's only if the stream resumed exactly, passes included;
`make test-full`'s the tiny Llama on the bundled sums, up front.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from runs import MOE, assert_router_loss_logged

from launcher.config.compose import PROJECT_ROOT

pytestmark = pytest.mark.slow

STREAMED = ("dataset.sources=[{path:data/arith/eval.jsonl,weight:1},"
            "{path:data/mix/chat.jsonl,format:chat,weight:1}]",
            "dataset.streaming=true", "dataset.shuffle_buffer=64")
"""Two sources drawn 1:1 until the 200 sums run out: a pass of ~400 rows, so the 800 rows
of 100 steps of 8 cross passes (each pass in its own block order)."""


@pytest.mark.parametrize(("rounds", "max_steps", "model"), [
    (2, 100, (*MOE, *STREAMED)), pytest.param(20, 800, (), marks=pytest.mark.full)])
def test_kill_9s_then_the_run_finishes_with_the_uninterrupted_runs_model(
    tmp_path: Path, rounds: int, max_steps: int, model: tuple[str, ...],
) -> None:
    done = subprocess.run(
        ["bash", str(PROJECT_ROOT / "scripts" / "chaos.sh"), str(rounds), "--work",
         str(tmp_path), "--atol", "1e-5", f"train.max_steps={max_steps}", *model],
        capture_output=True, text=True, timeout=3000,
        env={**os.environ, "PYTHON": sys.executable},  # this suite's interpreter
    )
    text = done.stdout
    assert "{" in text, done.stdout[-3000:] + done.stderr[-3000:]
    start = 0 if text.startswith("{") else text.index("\n{") + 1  # the report ends stdout
    report = json.loads(text[start:])
    print(json.dumps({k: v for k, v in report.items() if k != "launches"}))
    assert report["problems"] == [], report
    assert done.returncode == 0, done.stderr[-3000:]
    assert report["kills"] == rounds
    assert report["kills_during_save"] >= 1 and report["kills_of_one_rank"] >= 1, report
    launches = report["launches"]
    assert all(la["start_step"] == la["expected_start"] for la in launches), launches
    starts = [la["start_step"] for la in launches]
    assert starts[0] == 0 and starts == sorted(set(starts)), launches  # each one later
    assert report["final_step"] == max_steps
    assert report["max_abs_logit_diff"] <= 1e-5
    if model:  # the reference and the launch that finished (a killed one may end mid-line)
        for name in ("chaos-reference", "chaos"):
            (work,) = tmp_path.iterdir()
            assert_router_loss_logged(sorted((work / name).iterdir())[-1])
