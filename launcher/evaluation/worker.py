"""One process of a data-parallel evaluation (processes.py starts them under `accelerate
launch`): the request's tasks loaded offline, its model by path, the harness's share of
the examples; the first process writes the eval dir."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher.config.schema import EvalConfig
from launcher.data.eval_tasks import load_tasks
from launcher.evaluation.harness import evaluate
from launcher.rundir import EvalDir


def main(argv: list[str]) -> int:
    request_path = Path(argv[0])
    request = json.loads(request_path.read_text())
    ev = EvalConfig(**request["eval"])
    tasks = load_tasks(ev.tasks, ev.include_path)
    evaluate(request["model"], None, tasks, ev, EvalDir(request_path.parent),
             request["name"], request["label"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
