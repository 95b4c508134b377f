"""Shared benchmark plumbing: side-by-side runs, medians, one table, JSON results.

Each benchmark compares ours with a baseline measured in the same invocation (these
machines are shared and noisy, so only ratios of interleaved runs mean something) and
returns entries {"name", "ours", "baseline", "ratio", "unit", "runs", "spread"}: medians of
at least 3 runs each, spread = max/min of ours.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def wall_seconds(argv: Sequence[str], cwd: Path = ROOT) -> float:
    """Wall time of one process, start to exit; a failure is an error, not a figure."""
    start = time.perf_counter()
    done = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    return seconds


def side_by_side(
    name: str, ours: Callable[[], float], baseline: Callable[[], float], unit: str, runs: int = 3
) -> dict[str, Any]:
    """Interleave ours and the baseline `runs` times each; medians and their ratio."""
    mine, theirs = [], []
    for _ in range(runs):
        mine.append(ours())
        theirs.append(baseline())
    ours_median, base_median = statistics.median(mine), statistics.median(theirs)
    return {
        "name": name,
        "ours": ours_median,
        "baseline": base_median,
        "ratio": ours_median / base_median,
        "unit": unit,
        "runs": runs,
        "spread": max(mine) / min(mine),
    }


def report(bench: str, entries: list[dict[str, Any]]) -> None:
    """Print the table and write bench/results/<bench>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{bench}.json").write_text(json.dumps(entries, indent=2) + "\n")
    print(f"{'benchmark':<40}{'ours':>10}{'baseline':>10}{'ratio':>8}{'spread':>8}  unit")
    for e in entries:
        print(f"{e['name']:<40}{e['ours']:>10.3f}{e['baseline']:>10.3f}{e['ratio']:>8.3f}"
              f"{e['spread']:>8.2f}  {e['unit']}")
    print(f"written: {RESULTS / f'{bench}.json'}", file=sys.stderr)
