"""Disk pre-flight (launcher/estimator/disk.py, preflight.output_checks): checkpoint and
model sizes, how many checkpoints exist at once, and a real small filesystem that cannot
hold them."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.compose import compose_config
from launcher.errors import ConfigError
from launcher.estimator.disk import checkpoint_bytes, checkpoints_kept, disk_need
from launcher.estimator.estimate import estimate
from launcher.run.launch import check

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


def test_a_filesystem_too_small_for_the_checkpoints_is_refused_unless_forced(
    small_filesystem: Path, capsys
):
    # tiny Llama: ~0.2M parameters, 2 checkpoints of ~2 MiB each; 1 MiB cannot hold them.
    overrides = [f"run.output_dir={small_filesystem / 'runs'}", "train.max_steps=8",
                 "train.save_steps=4"]
    with pytest.raises(ConfigError) as error:
        check(overrides, "train")
    message = str(error.value)
    assert f"run.output_dir={small_filesystem / 'runs'}" in message
    assert "GiB free on its filesystem" in message and "2 checkpoint(s)" in message
    assert "or run.force=true to try anyway" in message
    assert not any(small_filesystem.iterdir())  # nothing written
    capsys.readouterr()
    assert check([*overrides, "run.force=true"], "train").cfg.run.force
    warning = capsys.readouterr().err
    assert warning.startswith("ftl: warning: run.output_dir=")
    assert "GiB free on its filesystem" in warning and "2 checkpoint(s)" in warning


# --- save time against the signal's grace time (ftl submit) --------------------------


def test_save_time_is_estimated_from_the_checkpoint_size():
    from launcher.estimator.disk import WRITE_BYTES_PER_S, save_time_estimate

    cfg = compose_config([*GPU, "precision=bf16", "strategy=zero3"])
    p, trainable = params(cfg)
    save = save_time_estimate(cfg, p, trainable)
    assert save.seconds == pytest.approx(16 * p / WRITE_BYTES_PER_S)
    assert "estimated" in save.source and "200 MB/s" in save.source


def test_the_last_measured_save_wins(tmp_path: Path):
    from launcher.estimator.disk import measured_save_time

    assert measured_save_time(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 4, "loss": 2.0}\n'
        '{"step": 4, "event": "save", "seconds": 3.5, "bytes": 10}\n'
        '{"step": 8, "event": "save", "seconds": 7.25, "bytes": 10}\n')
    save = measured_save_time(tmp_path)
    assert save is not None and save.seconds == 7.25 and "step 8" in save.source


SLURM_7B = [*GPU, "cluster=slurm", "precision=bf16", "strategy=zero3", "cluster.nodes=2"]


def grace_warnings(checked) -> list[str]:
    return [w for w in checked.warnings if "signal_grace_s=" in w]


@pytest.mark.parametrize(("grace", "warned"), [(120, True), (1200, False)])
def test_validation_warns_when_the_grace_time_cannot_cover_a_save(tmp_path, grace, warned):
    # dry_run: this machine's disk cannot hold a 7B run; the grace check does not care.
    checked = check([*SLURM_7B, f"run.output_dir={tmp_path}",
                     f"cluster.slurm.signal_grace_s={grace}"], "submit", dry_run=True)
    warnings = grace_warnings(checked)
    assert bool(warnings) == warned, checked.warnings
    if warned:  # 16 bytes x 6.7B parameters at 200 MB/s: about 540 s
        (warning,) = warnings
        assert f"signal_grace_s={grace} may be too short" in warning and "estimated" in warning
        assert "Fix: cluster.slurm.signal_grace_s=1080" in warning
    assert not any(tmp_path.iterdir())  # the stage writes nothing


def test_the_save_measured_by_the_resumed_run_beats_the_estimate(tmp_path):
    earlier = tmp_path / "tiny" / "20260101-000000"
    (earlier / "checkpoints" / "checkpoint-4").mkdir(parents=True)
    (earlier / "checkpoints" / "checkpoint-4" / "COMPLETE").write_text("")
    (earlier / "metrics.jsonl").write_text(
        '{"step": 4, "event": "save", "seconds": 500.0, "bytes": 10}\n')
    job = ["cluster=slurm", "cluster.gpu=cpu", "cluster.gpus_per_node=1", "run.name=tiny",
           f"run.output_dir={tmp_path}", "cluster.slurm.signal_grace_s=120"]
    (warning,) = grace_warnings(check(job, "submit"))  # the tiny model: the estimate is ~0 s
    assert "about 500 s (measured: the save of step 4" in warning
    assert not grace_warnings(check([*job, "run.resume=never"], "submit"))
