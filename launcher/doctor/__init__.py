"""`ftl doctor [--json] [overrides]`: what breaks multi-node jobs, checked on the run's own
world before training. The launching side is here: DOCTOR_MODULE runs instead of the worker
on every rank (the launcher's output: logs/doctor.log); probe.py joins and measures,
checks.py judges (pure). The checks and what passes: docs/guide.md, "Before a multi-node
run"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from launcher.doctor.checks import render
from launcher.launchers.command import DOCTOR_MODULE, with_module
from launcher.run.launch import check, write_run
from launcher.run.planner import resolve_tool
from launcher.rundir import RunDir

LOG = "doctor.log"


def doctor(overrides: list[str], as_json: bool = False) -> int:
    built = write_run(check(overrides, "train"), overrides)
    run_dir = RunDir(built.run_dir)
    launch = with_module(built.launch, DOCTOR_MODULE)
    print(f"ftl doctor: run dir {run_dir.path}; checking {built.plan.cfg.world_size} "
          "rank(s)", file=sys.stderr, flush=True)
    with (run_dir.logs / LOG).open("wb") as log:
        returncode = subprocess.run(resolve_tool(launch.argv), env={**os.environ, **launch.env},
                                    stdout=log, stderr=subprocess.STDOUT).returncode
    if returncode != 0 and run_dir.read_doctor() is None:
        print(f"ftl doctor: the launcher exited with code {returncode}; log: "
              f"{run_dir.logs / LOG}", file=sys.stderr)
    return show(run_dir, as_json)


def show(run_dir: RunDir, as_json: bool = False) -> int:
    """The table (or JSON) of RUN_DIR/doctor.json; 0 when every check passed."""
    report = run_dir.read_doctor()
    if report is None:
        print(f"ftl doctor: no {run_dir.doctor.name} in {run_dir.path}: the checks did not "
              "run to the end.", file=sys.stderr)
        for rank, error_file in run_dir.rank_errors().items():
            lines = error_file.read_text().strip().splitlines()
            print(f"  rank {rank}: {lines[-1] if lines else '?'}  (traceback: {error_file})",
                  file=sys.stderr)
        return 1
    document = report.to_dict()
    print(json.dumps(document, indent=2) if as_json else render(document), flush=True)
    return 0 if report.ok else 1
