"""`python -m launcher.doctor RUN_DIR [--json]`: print a run dir's doctor.json as the table
(or the JSON document); exit 0 when every check passed, 1 otherwise or when the doctor's
ranks wrote none (their errors are named). The job script's doctor step ends with it."""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher.doctor import show
from launcher.rundir import RunDir

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m launcher.doctor")
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    raise SystemExit(show(RunDir(args.run_dir), as_json=args.json))
