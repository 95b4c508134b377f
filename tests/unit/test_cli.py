"""`ftl` as a user runs it: a subprocess, real Hydra, nothing mocked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose_config

HEAVY = ("torch", "transformers", "deepspeed", "accelerate", "datasets", "peft")


def ftl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def run_in_process_and_list_heavy_imports(argv: list[str]) -> list[str]:
    code = (
        "import sys, io, contextlib\n"
        "from launcher.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main({argv!r})\n"
        "assert rc == 0, rc\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return eval(done.stdout.strip())  # noqa: S307 - our own printed list


def test_plan_of_the_done_criterion(tmp_path: Path) -> None:
    done = ftl("plan", "model=llama-7b", "strategy=zero3", "precision=bf16", "cluster.nodes=2",
               "cluster.gpus_per_node=8", f"run.output_dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "# strategy: zero3 (deepspeed)" in out
    assert '"stage": 3' in out and '"train_batch_size": 16' in out
    assert "--nnodes 2" in out or "--num_nodes 2" in out
    (run_dir,) = (tmp_path / "llama-7b-zero3").iterdir()
    for name in ("config.yaml", "ds_config.json", "launch.sh", "plan.json"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "plan.json").read_text())["world_size"] == 16


def test_plan_imports_no_heavy_library(tmp_path: Path) -> None:
    argv = ["plan", "model=llama-7b", "strategy=zero3", "precision=bf16", "cluster.nodes=2",
            "cluster.gpus_per_node=8", f"run.output_dir={tmp_path}"]
    assert run_in_process_and_list_heavy_imports(argv) == []


def test_ds_config_and_estimate_import_no_heavy_library(tmp_path: Path) -> None:
    out = tmp_path / "ds.json"
    assert run_in_process_and_list_heavy_imports(["ds-config", "-o", str(out),
                                                  "strategy=zero2"]) == []
    assert json.loads(out.read_text())["zero_optimization"]["stage"] == 2
    assert run_in_process_and_list_heavy_imports(["estimate", "model=llama-7b"]) == []


def test_bad_configuration_exits_2_with_every_problem_and_writes_nothing(tmp_path: Path) -> None:
    done = ftl("plan", "precision=fp16", "train.lr=0", "strategy=fsdp",
               "cluster.launcher=deepspeed", f"run.output_dir={tmp_path}")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "3 configuration errors" in done.stderr
    for key in ("precision=fp16", "train.lr=0", "cluster.launcher=deepspeed"):
        assert key in done.stderr
    assert not any(tmp_path.iterdir())


def test_unknown_option_exits_2(tmp_path: Path) -> None:
    done = ftl("plan", "strategy=zero4", f"run.output_dir={tmp_path}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "strategy=zero4: no such strategy" in done.stderr and "zero3_offload" in done.stderr


def test_ds_config_refuses_a_non_deepspeed_strategy() -> None:
    done = ftl("ds-config", "strategy=fsdp")
    assert done.returncode == 2 and "not a DeepSpeed strategy" in done.stderr


def test_train_refuses_what_this_machine_cannot_run(tmp_path: Path) -> None:
    done = ftl("train", "model=llama-7b", f"run.output_dir={tmp_path}")
    assert done.returncode == 2, done.stderr
    assert "model.path=meta-llama/Llama-2-7b-hf" in done.stderr
    assert "ftl plan" in done.stderr
    assert not any(tmp_path.iterdir())


def test_train_reports_bad_data_with_config_problems_before_launch(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"instruction": "a", "answer": "b"}\n')
    out = tmp_path / "out"
    done = ftl("train", f"dataset.path={data}", "precision=fp16", f"run.output_dir={out}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "2 configuration errors" in done.stderr
    assert "precision=fp16" in done.stderr
    assert f"dataset.path={data}" in done.stderr and "'output'" in done.stderr
    assert not out.exists()


def test_estimate_counts_the_bundled_tokens_on_request(tmp_path: Path) -> None:
    done = ftl("estimate", "--json", "--count-tokens", f"run.output_dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # the preset's epochs x tokens per epoch of data/arith in the built-in chat template
    assert report["tokens"] == compose_config([]).train.epochs * 241_736
    assert report["flops"] == 6 * report["params"] * report["tokens"]
    without = json.loads(ftl("estimate", "--json").stdout)
    assert without["tokens"] is None and without["flops"] is None


def test_quantize_validates_its_overrides_with_the_request(tmp_path: Path) -> None:
    out = tmp_path / "q8"
    done = ftl("quantize", str(tmp_path), "-o", str(out), "dataset.max_length=-1",
               "dataset.format=bogus")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "3 configuration errors" in done.stderr, done.stderr
    for shown in ("no config.json", "dataset.max_length=-1", "dataset.format=bogus"):
        assert shown in done.stderr, shown
    assert not out.exists()


def test_a_hub_model_offline_is_refused_before_anything_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """model=llama-3.1-8b (a hub id) with the hub unreachable: `ftl estimate --count-tokens`
    (which tokenizes) and `ftl train` end in validation with the fix each can use, not in
    transformers' OSError after its retries."""
    from launcher.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = "model.path=meta-llama/Llama-3.1-8B: not found on this machine"
    assert main(["estimate", "--count-tokens", "model=llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert missing in err and "train.max_steps instead of --count-tokens" in err, err
    assert main(["train", "model=llama-3.1-8b", f"run.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert missing in err and "`ftl submit` where the hub is reachable" in err, err
    assert not any(tmp_path.iterdir())


def test_a_directory_that_holds_no_model_or_tokenizer_is_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A weights-only or wrong directory: `ftl train` refuses model.path without config.json
    before any rank starts (each would fail to load it), and a tokenizer transformers cannot
    load is a ConfigError naming its key, not transformers' traceback."""
    from launcher.cli import main

    empty = tmp_path / "checkpoint"
    empty.mkdir()
    assert main(["train", f"model.path={empty}", f"run.output_dir={tmp_path / 'runs'}"]) == 2
    assert f"model.path={empty}: no config.json in it" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert main(["estimate", "--count-tokens", f"model.tokenizer={empty}",
                 f"dataset.cache_dir={tmp_path / 'cache'}"]) == 2
    err = capsys.readouterr().err
    assert f"model.tokenizer={empty}: transformers loads no tokenizer from it" in err, err
