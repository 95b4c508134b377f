"""`ftl eval` on a model the suite already trained (no training of its own): the LoRA run's
adapter (the tiny MoE's, on its experts and router too) through the CLI (in process), from
another folder, on the bundled task and a user task from --include-path (files in the run
dir, the harness's table), loaded on the base its run rebuilds, answers every example
exactly as its merged model/ does (in `ftl chat` too), scored by a worker of
eval.processes' `accelerate launch` (one: CPU splits nothing). ftl train's eval.tasks
(before and after, >= 90 % on the demo): test_ftl_train.py; under Slurm: test_slurm.py.
Offline refusals: tests/unit/test_eval_tasks.py."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from runs import EVIDENCE, EXPERT_LORA, Run, callbacks, describe_failure, write_user_task

from launcher.cli import main
from launcher.config.compose import PROJECT_ROOT
from launcher.config.schema import EvalConfig
from launcher.evaluation.processes import evaluate_in_processes
from launcher.rundir import EvalDir, RunDir, new_eval_dir

pytestmark = pytest.mark.slow


def newest_eval(run_dir: Path) -> EvalDir:
    return EvalDir(max((run_dir / "eval").iterdir(), key=lambda p: p.stat().st_mtime_ns))


def test_lora_adapter_answers_as_its_merged_model(
    trained: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    run = trained("lora-ddp-torchrun-fp32",  # test_train_peft.py's run: same name, overrides
                  ["strategy=ddp", "peft=lora", *EXPERT_LORA,
                   callbacks(*EVIDENCE, "ParamChecksumProbe")])
    assert run.returncode == 0, describe_failure(run)
    tasks = write_user_task(tmp_path)
    monkeypatch.chdir(tmp_path)  # not the project root
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["eval", str(run.run_dir / "model" / "adapter"), "--tasks",
                     "arith,my_sums", "--include-path", str(tasks),
                     "--limit", "6"])  # the CLI, in this process
    done = capfd.readouterr()
    assert code == 0, done.out[-3000:] + done.err[-3000:]
    assert "not a git repository" not in done.err  # the harness's git call, outside a checkout
    # peft's false "rank_pattern keys ... were ignored" on the experts' adapter, loading it
    assert not [w for w in caught if "pattern keys did not match" in str(w.message)]
    adapter = newest_eval(run.run_dir)
    summary = adapter.read_summary()
    assert summary is not None and summary.samples == 6 + 2
    assert summary.model == str(run.run_dir / "model" / "adapter")
    assert set(summary.scores) == {"arith", "my_sums"}
    results = json.loads(adapter.results.read_text())
    assert results["configs"]["arith"]["dataset_kwargs"]["data_files"]["test"] == str(
        PROJECT_ROOT / "data/arith/eval.jsonl")  # resolved from the project root
    assert "|arith  |" in done.out and "|my_sums|" in done.out, done.out
    assert str(adapter.path) in done.out

    # The merged model through eval.processes' path: a real `accelerate launch` of one
    # worker (the one size that splits nothing on CPU), the eval dir written by it.
    merged = new_eval_dir(RunDir(run.run_dir))
    model = str(run.run_dir / "model")
    summary = evaluate_in_processes(model, EvalConfig(tasks=["arith"], limit=6), merged,
                                    model, "model", processes=1)
    assert summary == merged.read_summary() and summary.model == model
    assert summary.samples == 6 and not (merged.path / "request.json").exists()
    answers = [[json.loads(line)["resps"] for line in d.samples("arith").read_text()
                .splitlines()] for d in (adapter, merged)]
    assert len(answers[0]) == 6 and answers[0] == answers[1]

    # The same model saved without a chat template (as dataset.format=text saves one):
    # the default turns the template off with one line; typed, it is refused before loading.
    plain = tmp_path / "no-template"
    shutil.copytree(run.run_dir / "model", plain, ignore=shutil.ignore_patterns("adapter"))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    code = main(["eval", str(plain), "--tasks", "arith", "--limit", "2"])
    done = capfd.readouterr()
    assert code == 0 and "has no chat template: prompts go in as plain text" in done.out, (
        done.out[-3000:] + done.err[-3000:])
    assert main(["eval", str(plain), "--tasks", "arith", "--apply-chat-template"]) == 2
    assert "Fix: --no-apply-chat-template" in capfd.readouterr().err

    # ftl chat takes the adapter too (loaded on its run's base) and answers as model/ does.
    replies = []
    for path in (run.run_dir / "model" / "adapter", run.run_dir / "model"):
        code = main(["chat", str(path), "--prompt", "12+30", "--max-new-tokens", "6"])
        done = capfd.readouterr()
        assert code == 0, done.err[-3000:]
        replies.append(done.out)
    assert replies[0] == replies[1] and replies[0].strip(), replies
