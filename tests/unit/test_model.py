"""Where a model is built: a from-config model's device (launcher/rank/model.build_device), and
the meta build of FSDP's ranks other than 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from launcher.config.compose import compose_config
from launcher.data.tokenizer import load_tokenizer
from launcher.engines import engine_of
from launcher.rank.model import build_device, build_model


@pytest.mark.parametrize(("strategy", "device"), [
    ("ddp", "cuda:1"), ("zero1", "cuda:1"), ("zero2", "cuda:1"), ("zero2_offload", "cuda:1"),
    # ZeRO-3's zero.Init partitions while building; FSDP shards a model built on the host
    ("zero3", "cpu"), ("zero3_offload", "cpu"), ("fsdp", "cpu"), ("fsdp_offload", "cpu"),
])
def test_gpu_builds_on_this_ranks_device_unless_partitioned_or_offloaded(
        strategy: str, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    cfg = compose_config([f"strategy={strategy}", "cluster.gpu=a100-80g"])
    assert build_device(cfg, engine_of(cfg.strategy)) == device


def test_cpu_preset_builds_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    cfg = compose_config(["strategy=ddp"])
    assert build_device(cfg, engine_of(cfg.strategy)) == "cpu"


def built(strategy: str, rank: int, monkeypatch: pytest.MonkeyPatch, *extra: str) -> Any:
    monkeypatch.setenv("RANK", str(rank))
    cfg = compose_config([f"strategy={strategy}", *extra])
    return build_model(cfg, engine_of(cfg.strategy), load_tokenizer(cfg))


def test_fsdp_ranks_but_0_build_an_unfilled_model_with_real_buffers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate broadcasts rank 0's weights into every shard (cpu_ram_efficient_loading):
    the other ranks need the structure with distinct host parameters (accelerate maps the
    optimizer by data_ptr), and the rotary buffers, which it copies as they are."""
    full, unfilled = built("fsdp", 0, monkeypatch), built("fsdp", 1, monkeypatch)
    params = list(unfilled.parameters())
    assert all(p.device.type == "cpu" for p in params)
    assert len({p.data_ptr() for p in params}) == len(params)
    assert [(n, p.shape, p.dtype, p.requires_grad) for n, p in unfilled.named_parameters()] == [
        (n, p.shape, p.dtype, p.requires_grad) for n, p in full.named_parameters()]
    buffers = dict(full.named_buffers())
    for name, buffer in unfilled.named_buffers():
        assert torch.equal(buffer, buffers[name]), name
    tied = built("fsdp", 1, monkeypatch, "model.tie_word_embeddings=true")
    assert tied.lm_head.weight is tied.get_input_embeddings().weight


def test_fsdp_rank_1_does_not_read_a_pretrained_checkpoint(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only config.json is read: the weights file may even be missing."""
    full = built("fsdp", 0, monkeypatch)
    full.save_pretrained(tmp_path)
    for weights in tmp_path.glob("*.safetensors"):
        weights.unlink()
    unfilled = built("fsdp", 1, monkeypatch, f"model.path={tmp_path}")
    assert [n for n, _ in unfilled.named_parameters()] == [n for n, _ in full.named_parameters()]


def test_models_read_from_disk_are_read_without_transformers_hub_kernels(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """transformers 5.25 kernelizes every from_pretrained model by default: on a GPU its
    layers would be fetched from the Hub, and under HF_HUB_OFFLINE=1 the load or the first
    train() raises (launcher/engines/pretrained.py). On this CPU nothing is swapped, so the
    model's own flag is the evidence: the rank's model.path load, ftl chat's (and quantize's,
    show_examples') load, and the harness's load by path. The other loads (a LoRA adapter's
    base, the merge, the MoE resume, eval.before) take the same NO_HUB_KERNELS."""
    from launcher.config.schema import EvalConfig
    from launcher.evaluation.harness import harness_model
    from launcher.inference.chat import load_for_inference

    cfg = compose_config(["strategy=ddp"])
    built("ddp", 0, monkeypatch).save_pretrained(tmp_path)
    load_tokenizer(cfg).save_pretrained(tmp_path)
    assert not built("ddp", 0, monkeypatch, f"model.path={tmp_path}").use_kernels
    assert not load_for_inference(tmp_path)[0].use_kernels
    assert not harness_model(str(tmp_path), None, EvalConfig()).model.use_kernels
