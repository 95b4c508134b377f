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


GIB = 1024**3


def write_memory_run_dir(run_dir: Path) -> None:
    """A 2-rank fsdp run dir as the worker writes it: plan.json's per-moment prediction,
    each rank's phases (rank 0 saves the gathered checkpoint)."""
    write_run_dir(run_dir)
    moments = {"construction": 0.5 * GIB, "first_step": 0.75 * GIB,
               "between_steps": 0.5 * GIB, "forward_backward": 1.0 * GIB,
               "optimizer_step": 0.8 * GIB, "checkpoint": 1.5 * GIB,
               "checkpoint_other_ranks": 0.5 * GIB}
    (run_dir / "plan.json").write_text(json.dumps(
        {"strategy": "fsdp", "world_size": 2, "gpu": "cpu",
         "estimate": {"gpu_bytes": 2 * GIB, "peak_bytes": 1.5 * GIB, "steady_bytes": GIB,
                      "moments": moments, "construction_above_training": False}}))
    for rank, checkpoint in ((0, 1.25), (1, 0.5)):
        phases = {"startup": 0, "model": 0.25, "engine": 0.5, "first_step": 0.75,
                  "steady": 1.0, "checkpoint": checkpoint, "final": 0.25}
        memory = {"peak_bytes": int(max(phases.values()) * GIB),
                  "rss_peak_bytes": 3 * GIB,
                  "phases": {k: {"peak_bytes": int(v * GIB)} for k, v in phases.items()}}
        (run_dir / "metrics" / f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "peak_memory_mib": 3072, "memory": memory}))


def test_report_shows_predicted_and_measured_per_phase_and_rank(tmp_path: Path) -> None:
    write_memory_run_dir(tmp_path)
    done = subprocess.run([sys.executable, "-m", "launcher", "report", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()
            if line.startswith("  ")}
    assert rows["phase"] == ["rank", "0", "rank", "1"]
    assert rows["model"] == ["0.500", "/", "0.250", "0.500", "/", "0.250"]
    assert rows["steady"] == ["1.000", "/", "1.000", "1.000", "/", "1.000"]
    # rank 0 gathers the checkpoint, the other ranks do not
    assert rows["checkpoint"] == ["1.500", "/", "1.250", "0.500", "/", "0.500"]
    assert rows["final"] == ["-", "/", "0.250", "-", "/", "0.250"]
    assert rows["run"] == ["peak", "1.500", "/", "1.250", "1.000", "/", "1.000"]
    assert rows["RSS"] == ["peak", "-", "/", "3.000", "-", "/", "3.000"]
    assert "estimated memory per device" not in done.stdout  # the table replaces it
