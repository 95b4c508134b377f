"""objective=dpo really trained: 2 CPU ranks, the tiny Llama, TRL's DPOTrainer.

- The demo as a user runs it (`ftl train objective=dpo`, one epoch of the bundled pairs,
  ddp, a full fine-tune with its frozen reference): the held-out pairs whose chosen answer
  the model itself finds more likely go from 0 % to >= 90 % (printed, pairs.json); TRL's
  reward metrics reach metrics.jsonl at every log and eval; `ftl report` prints and draws
  them; `ftl chat` on the model answers with the preferred style.
- The strategies (FAST_TRAIN's 8 steps, the injected probes): ddp, also the reference of
  test_graceful_stop.py's DPO case (exact resume after Ctrl-C), and fsdp starting from the
  SFT run's model/ (SFT -> DPO: model.path; the policy filled from rank 0, the reference
  read whole on every rank and sharded by TRL) in `make test`; every other strategy, LoRA
  under zero3 and fsdp and the precomputed reference in `make test-full`. Each: every
  rank's wrapper, twice the sequences of a pair batch, the DPO loss and eval loss falling,
  reward accuracy rising, complete checkpoints, a model/ that reproduces the trained logits.
The memory of DPO runs: test_memory_peak.py (dpo-zero3, dpo-lora-ddp). TRL's losses on
the same batch and a reference that never moves: tests/unit/test_objective.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from runs import Run, callbacks, describe_failure
from test_ftl_train import only_run_dir
from test_train_peft import base_model_dir  # noqa: F401 - the fixture
from test_train_strategies import (
    MAX_STEPS,
    MICRO_BATCH,
    WORLD,
    assert_checkpoints_complete,
    assert_saved_model_reproduces_logits,
    assert_wrapper,
    run_name,
    strategy_overrides,
)

from launcher.config.compose import PROJECT_ROOT
from launcher.run.report import report
from launcher.rundir import RunDir

pytestmark = pytest.mark.slow

DPO = ("objective=dpo",)
REWARDS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins")


def ftl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True,
                          text=True, timeout=900, cwd=PROJECT_ROOT, input=stdin)


def test_the_demo_learns_the_preference_and_every_tool_shows_it(tmp_path: Path) -> None:
    done = ftl("train", "objective=dpo", "train.epochs=1", f"run.output_dir={tmp_path}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = RunDir(only_run_dir(tmp_path))
    assert run_dir.path.parent.name == "tiny-llama-ddp-dpo"  # never an SFT run's name
    pairs = run_dir.read_pairs()
    assert pairs.count == 200
    assert pairs.ranked_before <= 0.5 and pairs.ranked_after >= 0.9, pairs
    assert (f"200 held-out pairs, chosen answer more likely than the rejected one: "
            f"{pairs.ranked_before:.1%} before training, {pairs.ranked_after:.1%} after"
            in done.stdout)
    metrics = [json.loads(line) for line in run_dir.metrics.read_text().splitlines()]
    logs = [m for m in metrics if "loss" in m]
    assert logs and all(all(key in m for key in REWARDS) for m in logs)
    evals = [m for m in metrics if "eval_rewards/accuracies" in m]
    assert [m["step"] for m in evals][0] == 0 and len(evals) >= 2  # on start, then steps
    assert evals[0]["eval_rewards/accuracies"] == 0  # policy = reference: no margin yet
    assert evals[-1]["eval_rewards/accuracies"] >= 0.9
    assert evals[-1]["eval_rewards/margins"] > evals[0]["eval_rewards/margins"] + 1

    text, png = report(run_dir.path)  # `ftl report`'s own function (its CLI: test_ftl_train)
    assert "reward eval accuracy: 0.0000 -> " in text
    assert png == run_dir.report_png and png.is_file()
    chat = ftl("chat", str(run_dir.model), stdin="12+30\n")
    assert chat.returncode == 0, chat.stderr
    assert "!" in chat.stdout.splitlines()[-1], chat.stdout  # the preferred style


FROM_SFT = "from_sft"
"""A case that starts from the SFT run's model/ (conftest.pretrained_dir: model.path)."""


def dpo_run(trained: Callable[..., Run], strategy: str, extra: tuple[str, ...] = (),
            sft_model: Path | None = None) -> Run:
    """FAST_TRAIN's 8 steps under objective=dpo with the injected probes (the ddp run is
    test_graceful_stop.py's DPO reference: the same name and overrides)."""
    name = run_name(strategy, "torchrun", "fp32", (*extra, *DPO))
    if FROM_SFT in extra:
        extra = (*(e for e in extra if e != FROM_SFT), f"model.path={sft_model}",
                 "model.tokenizer=")
    return trained(name, strategy_overrides(strategy, "torchrun", "fp32", (*extra, *DPO)))


FULL = pytest.mark.full
CASES = [
    pytest.param("ddp", (), id="ddp"),
    pytest.param("fsdp", (FROM_SFT,), id="fsdp-from-sft"),
    *[pytest.param(s, (), id=s, marks=FULL) for s in (
        "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "fsdp_offload")],
    pytest.param("zero3", ("peft=lora",), id="zero3-lora", marks=FULL),
    pytest.param("fsdp", ("peft=lora",), id="fsdp-lora", marks=FULL),
    *[pytest.param(s, ("objective.precompute_ref_log_probs=true",), id=f"{s}-precompute",
                   marks=FULL) for s in ("ddp", "zero3", "fsdp")],
]


@pytest.mark.parametrize(("strategy", "extra"), CASES)
def test_dpo_trains_under_the_strategy(
    trained: Callable[..., Run], strategy: str, extra: tuple[str, ...],
    request: pytest.FixtureRequest,
) -> None:
    sft = request.getfixturevalue("pretrained_dir") if FROM_SFT in extra else None
    run = dpo_run(trained, strategy, extra, sft)
    assert run.returncode == 0, describe_failure(run)
    result = run.result
    assert result["world_size"] == WORLD and result["global_step"] == MAX_STEPS
    lora = "peft=lora" in extra
    if not lora:
        assert_wrapper(run, strategy)
    # A batch of pairs is chosen + rejected: twice the rows. Under LoRA the reference is the
    # same module with its adapters disabled, so the model's own hook sees its forward too.
    forwards = 2 if lora and "precompute" not in "".join(extra) else 1
    for rank in range(WORLD):
        rows = run.probe("sharding", rank)["rows"]
        assert len(rows) == forwards * 2 * MAX_STEPS * MICRO_BATCH
    assert result["first_train_loss"] == pytest.approx(0.6931, abs=0.01)  # log 2: policy = ref
    # 8 steps: full fine-tunes 0.69 -> ~0.45, LoRA's rank-16 adapters 0.69 -> ~0.62
    assert result["final_eval_loss"] < result["first_eval_loss"] - (0.05 if lora else 0.1), result
    evals = [m for m in run.metrics() if "eval_rewards/accuracies" in m]
    assert evals[0]["eval_rewards/accuracies"] == 0 and evals[-1]["eval_rewards/accuracies"] > 0.5
    assert_checkpoints_complete(run, sharded_fsdp=False)
    if sft is not None:  # SFT -> DPO: it starts from the SFT model's weights, whose
        # log-likelihood of the chosen answers (the sums it learned) is far above a fresh
        # init's, read from the first eval of the DPO run from scratch
        scratch = [m for m in dpo_run(trained, "ddp").metrics() if "eval_logps/chosen" in m]
        assert evals[0]["eval_logps/chosen"] > scratch[0]["eval_logps/chosen"] + 5, (
            evals[0], scratch[0])
    if not lora:
        assert_saved_model_reproduces_logits(run, "fp32")



@pytest.mark.full
def test_qlora_dpo_trains_on_a_4bit_base(
    trained: Callable[..., Run], base_model_dir: Path,  # noqa: F811 - the imported fixture
) -> None:
    """QLoRA: the reference is the 4-bit base with the adapters disabled (no second model)."""
    run = trained("qlora-ddp-torchrun-fp32-objective-dpo", [
        "strategy=ddp", "peft=qlora", f"model.path={base_model_dir}", "model.tokenizer=",
        "model.intermediate_size=192", *DPO, callbacks("WrapperProbe")])
    assert run.returncode == 0, describe_failure(run)
    assert run.probe("wrapper", 0)["base_weights_4bit"] is True
    result = run.result
    assert result["first_train_loss"] == pytest.approx(0.6931, abs=0.01)
    assert result["final_eval_loss"] < result["first_eval_loss"] - 0.03, result  # ~0.05
