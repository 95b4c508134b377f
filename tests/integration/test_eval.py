"""`ftl eval` on models the suite already trained (no training of its own): the plain DDP
run's model/ on the bundled task and a user task from --include-path in one command (files
in the run dir, the harness's table); the LoRA run's adapter, loaded on the base its run
rebuilds, answers every example exactly as its merged model/ does. ftl train's eval.tasks
(before and after): test_ftl_train.py. Offline refusals: tests/unit/test_eval_tasks.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from runs import EVIDENCE, Run, callbacks, describe_failure

from launcher.config.compose import PROJECT_ROOT
from launcher.evaluation.verb import Request, ftl_eval
from launcher.rundir import EvalDir

pytestmark = pytest.mark.slow

USER_TASK = """task: my_sums
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{instruction}}}}"
doc_to_target: "{{{{output}}}}"
generation_kwargs: {{until: [], do_sample: false, max_gen_toks: 4}}
metric_list: [{{metric: exact_match, aggregation: mean, higher_is_better: true}}]
"""


def test_ftl_eval_scores_a_run_model_on_bundled_and_user_tasks(
    pretrained_dir: Path, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tmp_path / "sums.jsonl"
    data.write_text('{"instruction": "1+1", "output": "2"}\n'
                    '{"instruction": "2+2", "output": "4"}\n')
    (tasks / "my_sums.yaml").write_text(USER_TASK.format(data=data))
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "eval", str(pretrained_dir), "--tasks",
         "arith,my_sums", "--include-path", str(tasks), "--limit", "4",
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)  # not the project root
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = (tmp_path / "out" / "eval").iterdir()
    eval_dir = EvalDir(path)
    summary = eval_dir.read_summary()
    assert summary is not None and summary.samples == 4 + 2
    assert set(summary.scores) == {"arith", "my_sums"}
    for task, rows in (("arith", 4), ("my_sums", 2)):
        lines = eval_dir.samples(task).read_text().splitlines()
        assert len(lines) == rows and "exact_match" in json.loads(lines[0])
    results = json.loads(eval_dir.results.read_text())
    assert results["configs"]["arith"]["dataset_kwargs"]["data_files"]["test"] == str(
        PROJECT_ROOT / "data/arith/eval.jsonl")  # resolved from the project root
    assert "|arith  |" in done.stdout and "|my_sums|" in done.stdout, done.stdout


def test_lora_adapter_answers_as_its_merged_model(trained: Callable[..., Run]) -> None:
    run = trained("lora-ddp-torchrun-fp32",  # test_train_peft.py's run: same name, overrides
                  ["strategy=ddp", "peft=lora", callbacks(*EVIDENCE, "ParamChecksumProbe")])
    assert run.returncode == 0, describe_failure(run)
    answers = {}
    for name in ("model", "model/adapter"):
        assert ftl_eval(Request(run.run_dir / name, {"tasks": ["arith"], "limit": 6})) == 0
        newest = max((run.run_dir / "eval").iterdir(), key=lambda p: p.stat().st_mtime_ns)
        lines = EvalDir(newest).samples("arith").read_text().splitlines()
        answers[name] = [json.loads(line)["resps"] for line in lines]
        assert EvalDir(newest).read_summary().model == str(run.run_dir / name)
    assert len(answers["model"]) == 6 and answers["model"] == answers["model/adapter"]
