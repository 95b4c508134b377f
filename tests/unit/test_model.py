"""Where a model built from config is initialised (launcher/model.build_device)."""

from __future__ import annotations

import pytest

from launcher.compose import compose_config
from launcher.model import build_device


@pytest.mark.parametrize(("strategy", "device"), [
    ("ddp", "cuda:1"), ("zero1", "cuda:1"), ("zero2", "cuda:1"), ("zero2_offload", "cuda:1"),
    # ZeRO-3's zero.Init partitions while building; FSDP shards a model built on the host
    ("zero3", "cpu"), ("zero3_offload", "cpu"), ("fsdp", "cpu"), ("fsdp_offload", "cpu"),
])
def test_gpu_builds_on_this_ranks_device_unless_partitioned_or_offloaded(
        strategy: str, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    cfg = compose_config([f"strategy={strategy}", "cluster.gpu=a100-80g"])
    assert build_device(cfg) == device


def test_cpu_preset_builds_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert build_device(compose_config(["strategy=ddp"])) == "cpu"
