"""The estimate predicts the peak a run reaches: every strategy, ~52M Llama, 2 CPU ranks.

One short `ftl train` run per strategy (2 steps, a checkpoint at step 2), each rank's
live tensor bytes per phase recorded by the worker (launcher/rank/memtrace.py), the
prediction read from the run's own plan.json (launcher/estimator/peak.py). The runs are shared:
- zero1 and zero2 run with grad_accum 2, so they also give the zero1/zero2 gradient check;
- ddp runs at sequence length 128 and zero2_offload at micro batch 4, so with zero2's
  first micro batch (2 x 64) they give the activation doubling checks.
- zero1-tp2 is zero1 with parallel.tp=2 (DeepSpeed AutoTP: one rank's share of the split
  linears, rank 0 gathering the whole model to save it).
- zero3-sp2 is zero3 with parallel.sp=2 (DeepSpeed Ulysses: half of each sequence per rank,
  ZeRO-3 sharding over both; `make test-full` only).
`make test` runs ddp, fsdp and dpo-lora-ddp (SHORT: torch's engines, and LoRA with DPO);
`make test-full` all of them
(zero1-tp2 among them: TP's training, save and resume are test_tensor_parallel.py's, its
memory figure is docs/evidence/memory.md's).
Activations are
  measured as live bytes at the forward's end minus at the step's begin
  (tests/integration/probes.LiveBytesProbe), in strategies that hold nothing else then
  (ddp, zero1/2 before any gradient exists, zero2_offload: equal to within 4 KiB when
  measured side by side, docs/evidence/memory.md section 4).
LoRA (peft=lora, frozen base) runs under ddp, zero3 and fsdp (LORA_RUNS): their own
moments (docs/evidence/memory.md section 12), whose rank-0 peak is the final merged save.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runs import Run, callbacks, describe_failure

from launcher.config.architecture import count_params
from launcher.config.compose import compose_config
from launcher.estimator.memory import activation_bytes
from launcher.estimator.peak import other_ranks_peak
from launcher.run.report import memory_table
from launcher.rundir import RunDir

pytestmark = pytest.mark.slow

MODEL = ["model.hidden_size=1024", "model.num_layers=4", "model.intermediate_size=2752"]
"""The ~52M Llama (psi = 51,651,584; vocab 512): docs/evidence/memory.md's 102M Llama with half
its layers. Every term the estimate adds per layer (states, activations) halves with it, so
their shares of the peak stay as measured there; the per-tensor terms (largest tensor,
buckets, ZeRO-3's live parameters) keep their size and weigh twice as much. Its steps and
checkpoint cost half the 8-layer model's; both measured side by side: docs/evidence/memory.md."""
# Two steps: step 2 is a steady-state step (Adam's states exist since step 1's update), the
# LiveBytesProbe's, and its save is the checkpoint moment.
SHAPE = ["train.cpu_live_bytes=true", "train.max_steps=2", "train.save_steps=2",
         "train.eval_steps=0",
         "train.eval_on_start=false", "train.micro_batch_size=2", "dataset.max_length=64",
         "dataset.format=text", "dataset.eval_path=", "dataset.eval_fraction=0.02"]
RUNS: dict[str, list[str]] = {
    "ddp": ["dataset.max_length=128"],
    "zero1": ["train.grad_accum=2"],
    "zero2": ["train.grad_accum=2"],
    "zero2_offload": ["train.micro_batch_size=4"],
    "zero3": [],
    "zero3_offload": [],
    "fsdp": [],
    "fsdp_offload": [],
    "zero1-tp2": ["train.grad_accum=2", "parallel.tp=2"],
    "zero3-sp2": ["parallel.sp=2"],
}
LORA_RUNS = {"lora-ddp": "ddp", "lora-zero3": "zero3", "lora-fsdp": "fsdp"}
"""Run name -> strategy of the peft=lora runs (the three backends' LoRA code paths)."""
DPO_RUNS: dict[str, list[str]] = {
    "dpo-zero3": ["strategy=zero3"],
    "dpo-lora-ddp": ["peft=lora", "strategy=ddp"],
}
"""objective=dpo: a full fine-tune holding TRL's reference sharded like the policy, and
LoRA, whose reference is the base with the adapters disabled (no second model)."""
TOLERANCE = 0.15
SHORT = ("ddp", "fsdp", "dpo-lora-ddp")
"""The runs `make test` makes (~18 s each on 2 cores): torch's two engines, and DPO with
LoRA, which also stands for SFT's lora-ddp (the same engine moments, the pair batch on
top); the DeepSpeed runs and the activation-doubling checks are `make test-full`'s. What
`make test` keeps for those: each strategy's measured phases and the doubling pinned in
tests/unit/test_peak_memory.py (every ZeRO stage and offload among them) and DPO's
reference per strategy in tests/unit/test_dpo_estimate.py, which catch a changed
prediction; a changed engine (torch or DeepSpeed moving what it holds, which takes a new
pinned version in pyproject.toml) is what these live runs add, for DeepSpeed in
`make test-full` only."""


def full_unless_short(names: list[str]) -> list[object]:
    return [pytest.param(n, marks=[] if n in SHORT else [pytest.mark.full], id=n)
            for n in names]


def long_rows(path: Path) -> Path:
    """Rows far longer than max_length: every micro batch is exactly micro x max_length."""
    if not path.is_file():
        rng = random.Random(0)
        words = "alpha beta gamma delta seven plus minus equals reverse string".split()
        path.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=400))})
                                + "\n" for _ in range(200)))
    return path


def long_pairs(path: Path) -> Path:
    """Pairs whose answers run past max_length: every micro batch is exactly 2 x micro
    sequences of max_length tokens (prompt + chosen, prompt + rejected)."""
    if not path.is_file():
        rng = random.Random(0)
        words = "alpha beta gamma delta seven plus minus equals reverse string".split()

        def text(k: int) -> str:
            return " ".join(rng.choices(words, k=k))

        path.write_text("".join(
            json.dumps({"prompt": text(8), "chosen": text(200), "rejected": text(200)}) + "\n"
            for _ in range(200)))
    return path


@pytest.fixture(scope="module")
def memory_run(trained: Callable[..., Run], runs_root: Path) -> Callable[[str], Run]:
    data = long_rows(runs_root / "long-rows.jsonl")
    pairs = long_pairs(runs_root / "long-pairs.jsonl")

    def get(name: str) -> Run:
        if name in DPO_RUNS:
            extra = [*DPO_RUNS[name], "objective=dpo", "dataset.format=preference",
                     f"dataset.path={pairs}"]
        elif name in LORA_RUNS:
            extra = ["peft=lora", f"strategy={LORA_RUNS[name]}", f"dataset.path={data}"]
        else:
            extra = [*RUNS[name], f"strategy={name.split('-')[0]}", f"dataset.path={data}"]
        shape = [o for o in SHAPE if name not in DPO_RUNS or o != "dataset.format=text"]
        run = trained(f"memory-{name}", [
            *MODEL, *shape, callbacks("LiveBytesProbe"), *extra,
            f"dataset.cache_dir={runs_root / 'memory-data'}"])
        assert run.returncode == 0, describe_failure(run)
        # 0.8-1.5 GB of checkpoint and model per run that no test reads: the evidence is
        # the ranks' metrics, probes and result.json.
        for saved in ("checkpoints", "model"):
            shutil.rmtree(run.run_dir / saved, ignore_errors=True)
        return run

    return get


def plan_estimate(run: Run) -> dict[str, Any]:
    return RunDir(run.run_dir).read_plan().estimate


def rank_memory(run: Run, rank: int) -> dict[str, Any]:
    return RunDir(run.run_dir).read_rank_metrics(rank).memory


def measured_activations(run: Run, rank: int = 0) -> int:
    live = run.probe("live_bytes", rank)
    return live["forward_ends"][0] - live["step_begin"]


def ratio(predicted: float, measured: float) -> float:
    return predicted / measured


@pytest.mark.parametrize("strategy", full_unless_short([*RUNS, *LORA_RUNS, *DPO_RUNS]))
def test_predicted_peak_is_the_measured_peak(
    memory_run: Callable[[str], Run], strategy: str
) -> None:
    """Per rank: the steady-state phase against the predicted step peak, the whole run's
    peak against the predicted rank peak; result.json carries both side by side."""
    run = memory_run(strategy)
    est = plan_estimate(run)
    memory = run.result["memory"]
    assert memory["predicted_peak_bytes"] == int(est["peak_bytes"])
    assert len(memory["measured_peak_bytes"]) == len(memory["measured_rss_bytes"]) == 2
    for rank in (0, 1):
        phases = rank_memory(run, rank)["phases"]
        steady = ratio(est["steady_bytes"], phases["steady"]["peak_bytes"])
        print(f"{strategy} rank {rank}: predicted/measured steady {steady:.3f}")
        assert abs(steady - 1) <= TOLERANCE, (strategy, rank, steady)
        predicted_run = est["peak_bytes"] if rank == 0 else other_ranks_peak(est["moments"])
        whole = ratio(predicted_run, memory["measured_peak_bytes"][rank])
        print(f"{strategy} rank {rank}: predicted/measured whole run {whole:.3f}")
        assert abs(whole - 1) <= TOLERANCE, (strategy, rank, whole)
        if "final" in est["moments"]:  # LoRA: the merged save on rank 0, eval elsewhere
            final = est["moments"]["final" if rank == 0 else "final_other_ranks"]
            assert abs(ratio(final, phases["final"]["peak_bytes"]) - 1) <= TOLERANCE
    ranks = RunDir(run.run_dir).all_rank_metrics()
    assert [r.rank for r in ranks] == [0, 1]
    assert any("rank 1" in line for line in memory_table(est, ranks))


@pytest.mark.full
def test_zero1_holds_the_full_gradients_zero2_does_not(
    memory_run: Callable[[str], Run]
) -> None:
    """grad_accum 2: at the second micro batch's forward end zero1 still holds every
    gradient, zero2 only its partition; the difference is what the prediction says."""
    zero1, zero2 = memory_run("zero1"), memory_run("zero2")
    measured = (zero1.probe("live_bytes", 0)["forward_ends"][1]
                - zero2.probe("live_bytes", 0)["forward_ends"][1])
    predicted = (plan_estimate(zero1)["moments"]["forward_backward"]
                 - plan_estimate(zero2)["moments"]["forward_backward"])
    print(f"zero1 - zero2 at the 2nd forward end: measured {measured}, predicted {predicted}")
    assert abs(ratio(predicted, measured) - 1) <= TOLERANCE


@pytest.mark.full  # its base is the zero2 run
@pytest.mark.parametrize("doubled", ["ddp", "zero2_offload"])
def test_doubling_moves_measured_and_predicted_activations_alike(
    memory_run: Callable[[str], Run], doubled: str
) -> None:
    """ddp runs 2 x 128 tokens, zero2_offload 4 x 64; zero2's first micro batch is 2 x 64
    (grad_accum 2: no gradient exists yet at its forward's end)."""
    base_run, run = memory_run("zero2"), memory_run(doubled)
    moved = measured_activations(run) - measured_activations(base_run)
    base_cfg = compose_config([*MODEL, *SHAPE])
    cfg = compose_config([*MODEL, *SHAPE, *RUNS[doubled]])
    predicted = activation_bytes(cfg) - activation_bytes(base_cfg)
    print(f"{doubled}: activations moved by {moved} measured, {predicted:.0f} predicted")
    assert abs(ratio(predicted, moved) - 1) <= TOLERANCE


def test_fsdp_only_rank_0_fills_the_model_it_shards(memory_run: Callable[[str], Run]) -> None:
    """Rank 1 allocates its unsharded parameters but never writes them
    (launcher/model.unfilled_model): its resident memory does not grow by the model in the
    model phase, rank 0's does (it builds the seeded fp32 model that every shard gets). The
    allocator counts both alike, so the live-tensor prediction is the same on both. Rank 1's
    own growth is a fixed 13-22 MB (the phase's other allocations), whatever the model's
    size: a quarter of the 52M model's 207 MB tells it from a filled model (+227 MB on rank
    0)."""
    run = memory_run("fsdp")
    model_bytes = 4 * count_params(compose_config(MODEL).model)
    grown = []
    for rank in (0, 1):
        phases = rank_memory(run, rank)["phases"]
        grown.append(phases["model"]["rss_peak_bytes"] - phases["startup"]["rss_peak_bytes"])
        assert phases["model"]["peak_bytes"] >= model_bytes, (rank, phases["model"])
    print(f"fsdp: RSS grown in the model phase {grown}, model {model_bytes}")
    assert grown[0] > 0.5 * model_bytes, grown
    assert grown[1] < 0.25 * model_bytes, grown


def test_lora_dpo_holds_no_second_model(memory_run: Callable[[str], Run]) -> None:
    """objective=dpo with LoRA: the reference is the base with the adapters disabled, so a
    training step holds one model (measured 320 MB with the 207 MB fp32 base on the 52M
    Llama, its activations and adapters included; a second copy would add 207 MB), and the
    plan counts no reference."""
    run = memory_run("dpo-lora-ddp")
    model_bytes = 4 * count_params(compose_config(MODEL).model)
    assert plan_estimate(run)["reference_bytes"] == 0
    for rank in (0, 1):
        steady = rank_memory(run, rank)["phases"]["steady"]["peak_bytes"]
        assert steady < 2 * model_bytes, (rank, steady, model_bytes)
