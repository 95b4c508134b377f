"""Sequence parallelism (parallel.sp=2, DeepSpeed Ulysses under ZeRO-3) on 2 CPU ranks:
each rank runs every layer on half of each sequence (one data-parallel rank), the losses
are one process's on the same global batch, a stop and the same command resume exactly
(the resumed launch skips the trained batches through the Ulysses loader), and model/ is
a whole HF model whose logits are the trained model's.

One chain of two launches serves every assertion: the first stops right after the
checkpoint of step 4, the second resumes it to step 8. All three launches train on the
mixture preset (configs/dataset/mix.yaml), so they also prove that a mixture trains from
its recorded index and resumes at the exact example. The reference is the suite's
tiny-Llama ZeRO-3 run on 2 data-parallel ranks, zero3_offload's (test_train_strategies.py,
global batch 8 = 4 x 1 x 2; its plain zero3 run trains the tiny MoE, which Ulysses does
not take, validation/moe.py): offloading on a CPU moves nothing and changes no number, and
ZeRO-3's losses equal one process's (1 x 4 x 2, test_world_size_change.py): the same
weights at the start (zero.Init's, which differ from a plain build's) and the same batches.
Here the global batch is one micro batch of 8 (grad_accum 1): under Ulysses the Trainer
weights accumulated micro batches equally, not by their tokens (docs/evidence/stack.md), so
only a single micro batch per step is the token-weighted batch of the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from runs import MIXTURE, Run, assert_resumed_like, stop_then_resume
from test_train_strategies import (
    NO_GATHER,
    assert_saved_model_reproduces_logits,
    run_name,
    strategy_overrides,
)

from launcher.config.compose import compose_config
from launcher.errors import ConfigError
from launcher.rundir import RunDir
from launcher.validation.validate import validate

pytestmark = pytest.mark.slow

SP = ["strategy=zero3", "parallel.sp=2", "cluster.gpus_per_node=2", "precision=fp32",
      "train.micro_batch_size=8", "train.grad_accum=1", *MIXTURE]
STOP = 4


@pytest.fixture(scope="module")
def sp_chain(runs_root: Path) -> tuple[Run, Run]:
    return stop_then_resume(runs_root, "sp2", SP, STOP, "SequenceProbe", "LogitsProbe")


def test_sp2_trains_like_zero3_alone_and_resumes_exactly(
    trained: Callable[..., Run], sp_chain: tuple[Run, Run],
) -> None:
    reference = trained(run_name("zero3_offload", "torchrun", "fp32", NO_GATHER),
                        strategy_overrides("zero3_offload", "torchrun", "fp32", NO_GATHER))
    assert_resumed_like(sp_chain, reference, STOP)
    assert_trained_on_the_mixture(reference, *sp_chain)


def assert_trained_on_the_mixture(*runs: Run) -> None:
    """Every launch read one mixture (the same cache directory: the same examples in the
    same order), whose recorded index draws each source by its weight (configs/dataset/
    mix.yaml: 0.6, 0.3, 0.1) within 2 %."""
    from collections import Counter

    from datasets import load_from_disk

    (data_dir,) = {RunDir(run.run_dir).read_plan().data_dir for run in runs}
    assert data_dir is not None and Path(data_dir).name.startswith("mix-")
    counts = Counter(load_from_disk(str(Path(data_dir) / "index"))["source"])
    total = sum(counts.values())
    for source, weight in enumerate((0.6, 0.3, 0.1)):
        assert counts[source] / total == pytest.approx(weight, abs=0.02), counts


def test_sp2_splits_every_sequence_and_saves_the_whole_model(
    sp_chain: tuple[Run, Run],
) -> None:
    _, second = sp_chain
    width = compose_config(SP).dataset.max_length  # every batch padded to it (even)
    for rank in (0, 1):
        shapes = second.probe("sequence", rank)["shapes"]
        assert len(shapes) == 8 - STOP  # one micro batch per resumed step
        assert all(shape == [8, width // 2] for shape in shapes), shapes
    assert_saved_model_reproduces_logits(second, "fp32")


def test_sp_layouts_that_cannot_work_are_refused_before_launch() -> None:
    bad = compose_config(["strategy=zero2", "parallel.sp=4", "cluster.gpus_per_node=2",
                          "model.num_heads=6", "model.num_kv_heads=3", "dataset.packing=true",
                          "peft=lora", "parallel.tp=2"])
    with pytest.raises(ConfigError) as refused:
        validate(bad, "plan")
    text = str(refused.value)
    for needle in ("parallel.sp=4 with 2 ranks",
                   "parallel.sp=4 with model.num_heads=6",
                   "parallel.sp=4 with model.num_kv_heads=3",
                   "parallel.sp=4 with dataset.packing=true",
                   "parallel.sp=4 with peft=lora",
                   "parallel.tp=2 with parallel.sp=4",
                   "under ZeRO-2 gives gradients 4 times too large"):
        assert needle in text, text
    for strategy, reason in (("zero3_offload", "with offload is not measured"),
                             ("fsdp", "runs on DeepSpeed Ulysses under ZeRO-3")):
        with pytest.raises(ConfigError, match=reason):
            validate(compose_config([f"strategy={strategy}", "parallel.sp=2"]), "plan")
