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
    return entry(name, mine, theirs, unit)


def report(bench: str, entries: list[dict[str, Any]]) -> None:
    """Print the table and write bench/results/<bench>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{bench}.json").write_text(json.dumps(entries, indent=2) + "\n")
    print(f"{'benchmark':<40}{'ours':>10}{'baseline':>10}{'ratio':>8}{'spread':>8}  unit")
    for e in entries:
        print(f"{e['name']:<40}{e['ours']:>10.3f}{e['baseline']:>10.3f}{e['ratio']:>8.3f}"
              f"{e['spread']:>8.2f}  {e['unit']}")
    print(f"written: {RESULTS / f'{bench}.json'}", file=sys.stderr)


def entry(name: str, ours: Sequence[float], baseline: Sequence[float], unit: str,
          **extra: Any) -> dict[str, Any]:
    """One result from runs already interleaved by the caller (several figures per run)."""
    ours_median, base_median = statistics.median(ours), statistics.median(baseline)
    return {
        "name": name,
        "ours": ours_median,
        "baseline": base_median,
        "ratio": ours_median / base_median,
        "unit": unit,
        "runs": len(ours),
        "spread": max(ours) / min(ours),
        "baseline_spread": max(baseline) / min(baseline),
        **extra,
    }


def load_average() -> float:
    """The 1-minute load average (how busy the shared machine was while measuring)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def bench_env() -> dict[str, str]:
    """The environment for benchmark runs: DeepSpeed's JIT-built ops (on CPU, a shared-
    memory comm op built at the first distributed init) in a cache of this venv's own, built
    by this venv's ninja for every process, ours and the baseline's.
    DeepSpeed keys ~/.cache/torch_extensions by Python and torch version only, so two venvs
    on one machine rebuild each other's op (25-80 s of start-up each time), which would
    land in whichever run comes next."""
    import hashlib
    import os

    env = dict(os.environ)
    # ftl's ranks put this venv's bin (its ninja) first on PATH (launcher/engines/deepspeed/
    # ops.py); a baseline that found the system's ninja instead would rebuild the shared op
    # at every start, and ftl's run after it again (~24 s each, measured 2026-12-07).
    bin_dir = str(Path(sys.executable).parent)
    if env.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        env["PATH"] = os.pathsep.join(filter(None, [bin_dir, env.get("PATH", "")]))
    if "TORCH_EXTENSIONS_DIR" not in env:
        venv = hashlib.sha1(sys.prefix.encode()).hexdigest()[:12]
        env["TORCH_EXTENSIONS_DIR"] = str(Path.home() / ".cache" / "ftl-bench" /
                                          "torch_extensions" / venv)
    return env
