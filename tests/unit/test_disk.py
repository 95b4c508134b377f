"""Disk pre-flight (launcher/disk.py, preflight.output_problems): checkpoint and model sizes,
how many checkpoints exist at once, and a real small filesystem that cannot hold them."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.compose import compose_config
from launcher.disk import checkpoint_bytes, checkpoints_kept, disk_need
from launcher.errors import ConfigError
from launcher.estimate import estimate
from launcher.launch import check

GPU = ["model=llama-7b", "cluster.gpu=a100-80g", "cluster.gpus_per_node=8", "train.max_steps=10"]


def params(cfg) -> tuple[int, int]:
    est = estimate(cfg)
    return est.params, est.trainable_params


def test_full_finetune_checkpoint_holds_weights_and_adam_moments():
    fp32 = compose_config([*GPU, "precision=fp32", "strategy=ddp"])
    p, trainable = params(fp32)
    assert trainable == p
    assert checkpoint_bytes(fp32, p, trainable) == 12 * p  # fp32 weights + 2 fp32 moments
    for precision in ("fp32", "bf16"):  # + DeepSpeed's fp32 copy in its optimizer state
        zero3 = compose_config([*GPU, f"precision={precision}", "strategy=zero3"])
        assert checkpoint_bytes(zero3, p, p) == 16 * p


def test_lora_checkpoint_is_the_adapter_and_the_final_model_is_merged():
    cfg = compose_config([*GPU, "precision=bf16", "strategy=ddp", "peft=lora"])
    p, trainable = params(cfg)
    assert trainable < p / 100
    assert checkpoint_bytes(cfg, p, trainable) == trainable * (2 + 8)
    assert disk_need(cfg, p, trainable).final_model_bytes == 2 * p  # bf16 base, merged


@pytest.mark.parametrize(("overrides", "kept"), [
    (["train.save_total_limit=3"], (4, True)),  # the newest is written before the oldest goes
    (["train.max_steps=1000", "train.save_steps=300"], (4, True)),
    (["train.max_steps=-1", "train.epochs=1"], (1, False)),
])
def test_checkpoints_kept(overrides, kept):
    assert checkpoints_kept(compose_config(overrides)) == kept


def test_a_limit_of_one_is_refused():
    with pytest.raises(ConfigError, match=r"train.save_total_limit=1: keep 0 .* at least 2"):
        check(["train.save_total_limit=1"], "plan")


def test_output_dir_under_a_file_is_refused(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"run.output_dir=.*is a file, not a directory"):
        check([f"run.output_dir={blocker / 'out'}"], "train")


@pytest.fixture
def small_filesystem(tmpfs):
    return tmpfs("1m")


def test_a_filesystem_too_small_for_the_checkpoints_is_refused(small_filesystem: Path):
    # tiny Llama: ~0.2M parameters, 2 checkpoints of ~2 MiB each; 1 MiB cannot hold them.
    with pytest.raises(ConfigError) as error:
        check([f"run.output_dir={small_filesystem / 'runs'}", "train.max_steps=8",
               "train.save_steps=4"], "train")
    message = str(error.value)
    assert f"run.output_dir={small_filesystem / 'runs'}" in message
    assert "GiB free on its filesystem" in message and "2 checkpoint(s)" in message
    assert not any(small_filesystem.iterdir())  # nothing written
