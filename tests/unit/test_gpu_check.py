"""The GPU check's preparation, which runs here (bench/gpu_matrix.py, bench/wheel_closure.py):
what a GPU machine without a registry gets carried, the order the matrix's rows need, and
the matrix's own code at toy sizes on CPU (`--dry`: two rows here, every row in `make
test-full`). The rows at their real sizes run only on a GPU (`make test-gpu`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def closure() -> ModuleType:
    return bench_module("wheel_closure")


def test_the_wheelhouse_carries_what_the_machine_lacks_or_holds_too_old(
        closure: ModuleType, tmp_path: Path) -> None:
    """ftl's run-time closure at this venv's versions, never the machine's CUDA stack; a
    package the machine holds is left out only at a version every requirement accepts, or
    (version unknown) when ftl does not require it directly."""
    found, asked, direct = closure.closure({"eval"})
    assert {"transformers", "deepspeed", "lm-eval", "trl", "hydra-core"} <= set(found)
    assert not {"torch", "triton"} & set(found)
    assert not [name for name in found if name.startswith("nvidia-")]
    assert "lm-eval" not in closure.closure(set())[0]
    have = tmp_path / "have.txt"
    have.write_text("# a comment\ntransformers==5.17.0\nhuggingface-hub==1.33.0\nnumpy\n"
                    "tokenizers==0.19.0\npeft\nlm-eval==" + found["lm-eval"] + "\n")
    carried = {line.split("==")[0] for line in
               closure.wanted(found, asked, direct, closure.read_have(have))}
    assert "transformers" in carried  # 5.17 < pyproject's 5.23
    assert "tokenizers" in carried  # transformers asks for >= 0.23.1
    assert "huggingface-hub" in carried  # transformers 5.25 asks for >= 2.4.0
    assert "peft" in carried  # a direct requirement at an unknown version
    assert not {"numpy", "lm-eval"} & carried
    assert "deepspeed" in carried  # not on that machine at all
    # What only GPU rows need, beyond the closure: pinned, for gpu.sh and the wheelhouse.
    gpu_only = [line.split("#")[0].strip() for line in
                (BENCH / "gpu_only.txt").read_text().splitlines()]
    assert [r for r in gpu_only if r] == ["liger-kernel==0.8.5"]


def test_rows_that_use_the_base_model_come_after_it() -> None:
    """QLoRA and the eval row read the ddp-bf16 row's saved model: they must run after it,
    and the eval row runs only where lm_eval imports."""
    matrix = bench_module("gpu_matrix")
    names = [row.name for row in matrix.ROWS]
    for name in matrix.USES_BASE:
        assert names.index(matrix.QLORA_BASE) < names.index(name)
    (evaluation,) = [row for row in matrix.ROWS if row.kind == "eval"]
    assert evaluation.needs == ("lm_eval",) and evaluation.overrides == ("--tasks", "arith")
    assert matrix.eval_split(1) == ("--shard",)
    assert matrix.eval_split(4) == ("--processes", "4")


def test_a_row_the_budget_cuts_short_is_skipped_not_failed(tmp_path: Path) -> None:
    """Only a row stopped at its own timeout fails the check (exit 1); one whose cap the
    budget's end lowered is skipped, naming how to run it alone."""
    matrix = bench_module("gpu_matrix")
    row = matrix.ROWS[0]
    log = tmp_path / "row.log"
    cut = matrix.stopped({}, row, row.timeout - 1, log)
    assert cut["status"] == "skipped" and f"ROWS={row.name}" in cut["reason"]
    assert matrix.stopped({}, row, row.timeout, log)["status"] == "timed out"


def test_bad_knobs_are_refused_together_before_anything_installs() -> None:
    """gpu.sh runs --validate first: every bad knob named in one message, exit 2."""
    def validate(**knobs: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(BENCH / "gpu_matrix.py"), "--validate"],
                              capture_output=True, text=True, env={**os.environ, **knobs})

    bad = validate(STEPS="4", MICRO="two", ROWS="ddp-bf16 nope")
    assert bad.returncode == 2
    assert all(f in bad.stderr for f in ("STEPS=4", "MICRO=two", "unknown ['nope']")), bad.stderr
    assert validate(STEPS="5", ROWS="ddp-bf16 eval").returncode == 0


def dry_run(work: Path, rows: str | None = None) -> dict[str, dict[str, Any]]:
    """`bash bench/gpu.sh --dry` (ROWS: a subset) in `work`; its rows' records by name."""
    env = {**os.environ, "WORK": str(work)}
    if rows:
        env["ROWS"] = rows
    done = subprocess.run(["bash", str(BENCH / "gpu.sh"), "--dry"], capture_output=True,
                          text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    name = "gpu_matrix-partial.json" if rows else "gpu_matrix.json"
    return {r["row"]: r for r in json.loads((work / "results" / name).read_text())["rows"]}


@pytest.mark.slow
def test_a_train_row_and_the_eval_row_run_on_cpu_at_toy_sizes(tmp_path: Path) -> None:
    """make test's twin of the whole --dry matrix below: the matrix's run, measure and
    record code, a train row's figures and the eval row's comparison (~30 s)."""
    rows = dry_run(tmp_path, "ddp-bf16 eval")
    assert rows["ddp-bf16"]["status"] == "passed" and rows["ddp-bf16"]["tokens_per_s"] > 0
    assert rows["eval"]["status"] == "passed" and rows["eval"]["one_samples"] == 200
    assert rows["eval"]["answers_agree"] >= 0.95


@pytest.mark.full
def test_every_row_runs_on_cpu_at_toy_sizes(tmp_path: Path) -> None:
    """`bash bench/gpu.sh --dry`: the matrix's own code (runs, measures, records, the eval
    row's comparison) on CPU, so a GPU's minutes never find a bug in it. A row refused on
    CPU (fp16, flex) or whose package is missing here (Liger, FlashAttention) is skipped;
    every other row passes (~2 min; `make test-full`)."""
    rows = dry_run(tmp_path)
    assert {name for name, r in rows.items() if r["status"] == "skipped"} <= {
        "ddp-fp16", "attn-flex", "attn-fa2", "attn-fa3", "packed-fa2", "liger"}
    assert rows["eval"]["status"] == "passed" and rows["eval"]["one_samples"] == 200
    assert rows["eval"]["answers_agree"] >= 0.95
    assert all(rows[n]["tokens_per_s"] > 0 for n in ("ddp-bf16", "qlora", "moe-zero3",
                                                     "packed"))
