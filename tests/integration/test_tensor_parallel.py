"""Tensor parallelism (parallel.tp=2, DeepSpeed AutoTP) on 2 CPU ranks: every decoder
linear is split over the two ranks (one data-parallel rank), the losses are those of the
suite's 2-rank ddp run on the same global batch (test_train_strategies.py's; the same
samples per optimizer step, summed in another order: rel REL), a stop and the same command
resume exactly, and model/ is a whole HF model whose logits are the trained model's.

One chain of two launches serves every assertion: the first stops right after the
checkpoint of step 4, the second resumes it to step 8.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from runs import Run, assert_resumed_like, stop_then_resume
from test_train_strategies import (
    assert_saved_model_reproduces_logits,
    run_name,
    strategy_overrides,
)

from launcher.config.compose import compose_config
from launcher.errors import ConfigError
from launcher.validation.validate import validate

pytestmark = pytest.mark.slow

BATCH = ["train.grad_accum=2", "precision=fp32"]  # global batch 8 = 4 x 2 x 1 data rank
REL = 1e-4
"""As test_world_size_change.py's: the ddp run's global batch is 4 x 1 x 2 data ranks."""
TP = ["strategy=zero1", "parallel.tp=2", "cluster.gpus_per_node=2", *BATCH]
STOP = 4


@pytest.fixture(scope="module")
def tp_chain(runs_root: Path) -> tuple[Run, Run]:
    return stop_then_resume(runs_root, "tp2", TP, STOP, "ShapeProbe", "LogitsProbe")


def test_tp2_trains_like_data_parallel_and_resumes_exactly(
    trained: Callable[..., Run], tp_chain: tuple[Run, Run],
) -> None:
    ddp = trained(run_name("ddp", "torchrun", "fp32"),
                  strategy_overrides("ddp", "torchrun", "fp32"))
    assert_resumed_like(tp_chain, ddp, STOP, rel=REL)


def test_tp2_splits_every_decoder_linear_and_saves_the_whole_model(
    tp_chain: tuple[Run, Run],
) -> None:
    _, second = tp_chain
    cfg = compose_config(TP)
    h = cfg.model.hidden_size
    kv = h // cfg.model.num_heads * cfg.model.num_kv_heads
    inter = cfg.model.intermediate_size
    for rank in (0, 1):
        shapes = second.probe("shapes", rank)["shapes"]
        layer = "model.layers.0."
        assert shapes[layer + "self_attn.q_proj.weight"] == [h // 2, h]  # rows split
        assert shapes[layer + "self_attn.k_proj.weight"] == [kv // 2, h]
        assert shapes[layer + "self_attn.o_proj.weight"] == [h, h // 2]  # columns split
        assert shapes[layer + "mlp.up_proj.weight"] == [inter // 2, h]
        assert shapes[layer + "mlp.down_proj.weight"] == [h, inter // 2]
        assert shapes["model.embed_tokens.weight"] == [cfg.model.vocab_size, h]  # whole
    model = assert_saved_model_reproduces_logits(second, "fp32")
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (h, h)


def test_tp_layouts_that_cannot_work_are_refused_before_launch() -> None:
    bad = compose_config(["strategy=ddp", "parallel.tp=4", "cluster.gpus_per_node=2",
                          "model.num_kv_heads=2", "peft=lora"])
    with pytest.raises(ConfigError) as refused:
        validate(bad, "plan")
    text = str(refused.value)
    for needle in ("parallel.tp=4 with cluster.gpus_per_node=2",
                   "parallel.tp=4 with model.num_kv_heads=2",
                   "parallel.tp=4 with peft=lora"):
        assert needle in text, text
    offload = compose_config(["strategy=zero2_offload", "parallel.tp=2"])
    with pytest.raises(ConfigError, match="AutoTP with offload is not supported"):
        validate(offload, "plan")
    plain = compose_config(["strategy=ddp", "parallel.tp=2"])
    with pytest.raises(ConfigError, match="tensor parallelism runs on DeepSpeed's AutoTP"):
        validate(plain, "plan")
