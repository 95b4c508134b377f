"""`ftl report`: the PNG opens and the summary puts estimate beside measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.image


def write_run_dir(run_dir: Path) -> None:
    history = [{"step": s, "loss": 3.0 - 0.2 * s, "learning_rate": 1e-3 * (1 - s / 10),
                "tokens_per_s": 900.0 + s} for s in range(1, 9)]
    history += [{"step": 8, "eval_loss": 2.1},
                {"step": 8, "train_loss": 2.0, "train_runtime": 12.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in history))
    (run_dir / "plan.json").write_text(json.dumps(
        {"strategy": "zero2", "world_size": 2, "gpu": "cpu",
         "estimate": {"gpu_bytes": 2 * 1024**3, "est_seconds": 10.0}}))
    (run_dir / "metrics").mkdir()
    for rank in (0, 1):
        (run_dir / "metrics" / f"rank{rank}.json").write_text(
            json.dumps({"rank": rank, "peak_memory_mib": (rank + 1) * 1024}))


def test_report_draws_a_png_and_compares(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    done = subprocess.run([sys.executable, "-m", "launcher", "report", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    image = matplotlib.image.imread(tmp_path / "report.png")
    assert image.shape[0] > 100 and image.shape[1] > 300
    assert image.std() > 0.01  # something was drawn
    out = done.stdout
    assert "train loss: 2.8000 -> 1.4000" in out
    assert "estimated memory per device: 2.000 GiB" in out
    assert "measured peak memory, rank 1: 2.000 GiB" in out
    assert "measured train time: 12.5 s" in out
    assert "throughput, tokens/s: 904.5" in out


def test_report_on_a_dir_without_metrics_exits_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "launcher", "report", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no metrics.jsonl" in done.stderr
