"""Plan latency: `ftl plan model=llama-7b strategy=zero3` against `python -c "import
deepspeed"` (what a launcher that imports its engine pays before deciding anything).
Target: ratio <= 0.1. Run: `make bench` or `.venv/bin/python bench/plan_latency.py`."""

from __future__ import annotations

import sys
import tempfile

from common import report, side_by_side, wall_seconds


def main() -> int:
    with tempfile.TemporaryDirectory() as out:
        plan = [sys.executable, "-m", "launcher", "plan", "model=llama-7b", "strategy=zero3",
                f"run.output_dir={out}"]
        entry = side_by_side(
            "plan latency (ftl plan / import deepspeed)",
            lambda: wall_seconds(plan),
            lambda: wall_seconds([sys.executable, "-c", "import deepspeed"]),
            unit="s",
        )
    report("plan_latency", [entry])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
