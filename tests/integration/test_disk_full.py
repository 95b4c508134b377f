"""A disk that fills up during a checkpoint save: `ftl train` fails with a clear error
that names the full filesystem and the complete checkpoint it keeps; once space is freed,
the same command resumes from that checkpoint and finishes. The run has no eval set at all
(no eval_path, eval_fraction 0), which must train and finish too. On a real small filesystem
(a tmpfs, mounted as root: CI runs as root and fails on a skip)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from runs import FAST_TRAIN, free_port

from launcher.config.compose import PROJECT_ROOT
from launcher.rundir.checkpoints import is_complete, list_checkpoints

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmpfs: Callable[[str], Path]) -> Path:
    return tmpfs("32m")


def ftl_train(overrides: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run([sys.executable, "-m", "launcher", "train", *overrides],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_full_disk_during_a_save_keeps_the_last_checkpoint_and_says_so(
    small_disk: Path, tmp_path: Path,
) -> None:
    output, filler = small_disk / "runs", small_disk / "filler"
    no_eval = ["train.eval_on_start=false", "dataset.eval_path=", "dataset.eval_fraction=0"]
    overrides = [*FAST_TRAIN, *no_eval, "strategy=ddp", f"run.output_dir={output}",
                 "run.name=full",
                 f"dataset.cache_dir={tmp_path / 'cache'}", f"cluster.master_port={free_port()}"]
    fill = (f"train.callbacks=[{{_target_:tests.integration.probes.FillDisk,step:8,"
            f"path:'{filler}'}}]")
    failed = ftl_train([*overrides, fill])
    assert failed.returncode == 1, failed.stdout[-2000:] + failed.stderr[-3000:]
    (first,) = (output / "full").iterdir()
    kept = first / "checkpoints" / "checkpoint-4"
    assert f"the filesystem of {first} is full" in failed.stderr, failed.stderr[-3000:]
    assert f"{kept} is complete and kept" in failed.stderr
    assert is_complete(kept)
    assert [c.name for c in list_checkpoints(first / "checkpoints") if is_complete(c)] == [
        "checkpoint-4"]  # the save of step 8 never completed
    assert not (first / "result.json").exists()

    filler.unlink()
    again = ftl_train(overrides)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    second = max(p for p in (output / "full").iterdir() if p != first)
    (launch,) = [json.loads(line) for line in (second / "launches.jsonl").read_text().splitlines()]
    assert launch["resumed_from"] == str(kept) and launch["start_step"] == 4
    result = json.loads((second / "result.json").read_text())
    assert result["global_step"] == 8 and result["final_eval_loss"] is None
