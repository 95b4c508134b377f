"""`python -m launcher.doctor RUN_DIR [--json]`: print a run dir's doctor.json as the table
(or the JSON document); exit 0 when every check passed, 1 otherwise or when the doctor's
ranks wrote none (their errors are named). The job script's doctor step ends with it."""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.doctor.verb import show
from launcher.rundir import RunDir

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) > 2 or (len(args) == 2 and "--json" not in args):
        print("usage: python -m launcher.doctor RUN_DIR [--json]", file=sys.stderr)
        raise SystemExit(2)
    run_dir = [arg for arg in args if arg != "--json"][0]
    raise SystemExit(show(RunDir(Path(run_dir)), as_json="--json" in args))
