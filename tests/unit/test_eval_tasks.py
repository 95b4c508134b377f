"""The harness's tasks as `ftl eval` and `eval.tasks` load them: the bundled demo task from
any directory, offline; a hub task whose data is not cached and an unknown name refused in
one error, with the fix; the eval.* rules; `--before` on a model dir refused; a model
saved without a chat template."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.config.compose import PROJECT_ROOT, compose_config
from launcher.config.schema import EvalConfig
from launcher.data.eval_tasks import bundled_tasks, load_tasks
from launcher.errors import ConfigError
from launcher.evaluation.verb import Request, ftl_eval
from launcher.validation.evaluation import eval_key_problems
from launcher.validation.rules import config_problems


def test_bundled_task_loads_offline_with_its_data_resolved(
        monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert bundled_tasks()["arith"]["dataset_kwargs"]["data_files"]["test"] == str(
        PROJECT_ROOT / "data/arith/eval.jsonl")
    (task,) = load_tasks(["arith"])
    assert task.task_name == "arith" and len(task.dataset["test"]) == 200


def test_uncached_hub_task_and_unknown_name_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError) as refused:
        load_tasks(["hellaswag", "arcc_easy", "arith"])
    uncached, unknown = refused.value.problems
    assert "'hellaswag': its data is not in the HF cache" in uncached
    assert "ftl eval --prefetch --tasks hellaswag" in uncached
    assert "'arcc_easy' is not a task" in unknown and "arc_easy" in unknown


def test_eval_keys_are_checked_with_their_fixes() -> None:
    bad = EvalConfig(limit=2.5, num_fewshot=-1, batch_size=0, include_path="/no/such/dir")
    problems = eval_key_problems(bad)
    assert [p.split(":")[0] for p in problems] == [
        "eval.limit=2.5", "eval.num_fewshot=-1", "eval.batch_size=0",
        "eval.include_path=/no/such/dir"]
    assert eval_key_problems(EvalConfig(limit=0.5)) == []
    cfg = compose_config(["eval.before=true"])
    assert any(p.startswith("eval.before=true without eval.tasks") for p in
               config_problems(cfg))


def test_before_with_a_model_dir_is_refused_not_ignored(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--before with .*Fix: ftl eval RUN_DIR --before"):
        ftl_eval(Request(Path(tmp_path), {"tasks": ["arith"], "before": True}))


def test_a_model_without_a_chat_template_is_prompted_as_plain_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """eval.apply_chat_template (on by default) with a tokenizer saved without a chat
    template (dataset.format=text): the harness would fail at its first prompt, so the
    default turns off with one line and a typed --apply-chat-template is refused."""
    from launcher.evaluation.models import saved_chat_template
    from launcher.evaluation.verb import _check, chat_template_off, chat_template_problem

    assert saved_chat_template(tmp_path) is None  # no tokenizer saved: not known
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    assert saved_chat_template(tmp_path) is False
    on = EvalConfig(tasks=["arith"])
    assert chat_template_problem(tmp_path, None) is None
    assert chat_template_off(on, tmp_path).apply_chat_template is False
    assert "has no chat template: prompts go in as plain text" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"--apply-chat-template with .*Fix: "
                                          r"--no-apply-chat-template") as refused:
        _check(replace(on, batch_size=0), "ftl eval", "plain",
               chat_template_problem(tmp_path, True))
    assert len(refused.value.problems) == 2  # with the others, in one error
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert chat_template_problem(tmp_path, True) is None
    assert chat_template_off(on, tmp_path) == on


def test_data_parallel_evaluation_is_refused_where_it_would_not_split() -> None:
    """eval.processes: GPUs only (HFLM splits examples across CUDA devices; on CPU every
    process would score every example), never more than the node has, not with --shard,
    not for a model ftl loads itself. eval.shard: GPUs only too (on CPU the harness fails
    at the first batch). Its launch: accelerate's, one worker per GPU. The workers through
    a real `accelerate launch`: tests/integration/test_eval.py."""
    from launcher.evaluation.processes import launch_argv, processes_problem, shard_problem

    assert shard_problem(1) is None
    assert str(shard_problem(0)).startswith("eval.shard=true (--shard): this machine has no")
    shard_cpu = config_problems(compose_config(["eval.tasks=[arith]", "eval.shard=true"]))
    assert any(p.startswith("eval.shard=true with cluster.gpu=cpu") for p in shard_cpu)
    assert not [p for p in config_problems(compose_config(
        ["cluster.gpu=a100-80g", "eval.tasks=[arith]", "eval.shard=true"])) if "shard" in p]

    assert eval_key_problems(EvalConfig(processes=0))[0].startswith("eval.processes=0:")
    assert "with eval.shard=true" in eval_key_problems(EvalConfig(processes=2, shard=True))[0]
    on_cpu = config_problems(compose_config(["eval.tasks=[arith]", "eval.processes=2"]))
    assert any(p.startswith("eval.processes=2 with cluster.gpu=cpu") for p in on_cpu)
    gpus = ["cluster.gpu=a100-80g", "cluster.gpus_per_node=4", "eval.tasks=[arith]"]
    too_many = config_problems(compose_config([*gpus, "eval.processes=8"]))
    assert any("Fix: eval.processes=4" in p for p in too_many)
    assert not [p for p in config_problems(compose_config([*gpus, "eval.processes=4"]))
                if p.startswith("eval.")]
    four = EvalConfig(processes=4)
    assert processes_problem(four, "plain", 4) is None
    assert "this machine has 0 GPU(s)" in str(processes_problem(four, "plain", 0))
    assert "with an adapter model: ftl loads it itself" in str(
        processes_problem(four, "adapter", 8))
    argv = launch_argv(4, "/run/eval/x/request.json")
    assert argv[1:3] == ["-m", "accelerate.commands.launch"]
    assert argv[argv.index("--num_processes") + 1] == "4" and "--multi_gpu" in argv
    assert argv[argv.index("--gpu_ids") + 1] == "all"  # not the user's accelerate config's
    assert argv[-3:] == ["--module", "launcher.evaluation.worker", "/run/eval/x/request.json"]


def test_the_results_git_hash_is_read_without_git_complaining_outside_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    import subprocess

    import lm_eval.evaluator

    from launcher.evaluation.harness import quiet_git_hash, quiet_harness

    quiet_harness()
    assert lm_eval.evaluator.get_git_commit_hash is quiet_git_hash  # what simple_evaluate calls
    monkeypatch.chdir(PROJECT_ROOT)
    head = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (CI's clone is one): the harness's own value
        assert quiet_git_hash() == head.stdout.strip()
    monkeypatch.chdir(tmp_path)
    assert quiet_git_hash() is None
    assert "not a git repository" not in capfd.readouterr().err
