"""Each validation rule: the message names the key as typed, the value, and the fix."""

from __future__ import annotations

import pytest

from launcher.compose import compose_config
from launcher.errors import ConfigError
from launcher.validate import validate


def problems_for(overrides: list[str], *, launching_locally: bool = False) -> list[str]:
    cfg = compose_config(overrides)
    with pytest.raises(ConfigError) as caught:
        validate(cfg, launching_locally=launching_locally)
    return caught.value.problems


def only_problem(overrides: list[str], **kwargs: bool) -> str:
    problems = problems_for(overrides, **kwargs)
    assert len(problems) == 1, problems
    return problems[0]


def test_default_config_is_valid() -> None:
    validate(compose_config([]), launching_locally=True)


def test_fp16_on_cpu_names_precision_and_fix() -> None:
    message = only_problem(["precision=fp16"])
    assert "precision=fp16" in message and "cluster.gpu=cpu" in message
    assert "Fix: precision=bf16 or precision=fp32" in message


def test_fp16_on_gpu_preset_is_valid() -> None:
    validate(compose_config(["precision=fp16", "cluster.gpu=v100-32g"]))


def test_bf16_on_v100_is_refused() -> None:
    message = only_problem(["precision=bf16", "cluster.gpu=v100-32g"])
    assert "precision=bf16" in message and "cluster.gpu=v100-32g" in message
    assert "Fix: precision=fp16" in message


def test_offload_param_needs_zero3() -> None:
    message = only_problem(["strategy=zero2_offload", "strategy.offload_param=true"])
    assert "strategy.offload_param=true" in message and "ZeRO stage 2" in message
    assert "Fix: strategy=zero3_offload" in message


def test_fsdp_with_deepspeed_launcher_is_refused() -> None:
    message = only_problem(["strategy=fsdp", "cluster.launcher=deepspeed"])
    assert "cluster.launcher=deepspeed" in message and "Fix: cluster.launcher=torchrun" in message


def test_local_multi_node_is_refused_when_launching() -> None:
    overrides = ["cluster.nodes=2"]
    validate(compose_config(overrides))  # a plan for 2 nodes is fine
    message = only_problem(overrides, launching_locally=True)
    assert "cluster.nodes=2 with cluster=local" in message
    assert "ftl submit cluster=slurm cluster.nodes=2" in message


def test_local_multi_node_with_deepspeed_hostfile_is_allowed() -> None:
    cfg = compose_config(
        ["cluster.nodes=2", "cluster.launcher=deepspeed", "cluster.hostfile=/etc/hosts"]
    )
    validate(cfg, launching_locally=True)


def test_train_refuses_slurm_cluster() -> None:
    message = only_problem(["cluster=slurm", "cluster.gpu=cpu"], launching_locally=True)
    assert "cluster=slurm" in message and "ftl submit" in message


@pytest.mark.parametrize(
    "override",
    [
        "train.micro_batch_size=0",
        "train.grad_accum=-1",
        "train.lr=0",
        "train.lr=-1e-5",
        "cluster.nodes=0",
        "cluster.gpus_per_node=0",
        "train.save_steps=0",
        "dataset.max_length=0",
    ],
)
def test_non_positive_values_are_refused(override: str) -> None:
    message = only_problem([override])
    assert message.startswith(override.replace("=", "=", 1).split("=")[0])
    assert "must be greater than 0" in message and "Fix:" in message


def test_zero_max_steps_is_refused() -> None:
    message = only_problem(["train.max_steps=0"])
    assert "train.max_steps=0" in message and "-1" in message


def test_global_batch_mismatch_suggests_grad_accum() -> None:
    overrides = ["cluster.gpus_per_node=2", "train.micro_batch_size=4",
                 "train.global_batch_size=32"]
    message = only_problem(overrides)
    assert "train.global_batch_size=32" in message
    assert "4 x 1 x 2 = 8" in message
    assert "Fix: train.grad_accum=4" in message


def test_global_batch_that_matches_is_valid() -> None:
    overrides = ["cluster.gpus_per_node=2", "train.micro_batch_size=4", "train.grad_accum=4",
                 "train.global_batch_size=32"]
    validate(compose_config(overrides))


def test_global_batch_not_divisible_explains() -> None:
    overrides = ["cluster.gpus_per_node=2", "train.micro_batch_size=4",
                 "train.global_batch_size=12"]
    message = only_problem(overrides)
    assert "divisible by train.micro_batch_size x world size (8)" in message


def test_unknown_choice_lists_the_options() -> None:
    message = only_problem(["cluster.gpu=a100-20g"])
    assert "cluster.gpu=a100-20g" in message
    assert "h100-80g" in message and "v100-32g" in message


def test_max_length_longer_than_model() -> None:
    message = only_problem(["dataset.max_length=1000"])
    assert "dataset.max_length=1000" in message and "model.max_position_embeddings=256" in message


def test_qlora_with_zero3_is_refused() -> None:
    message = only_problem(["peft=qlora", "strategy=zero3"])
    assert "peft=qlora" in message and "strategy=zero3" in message


def test_every_problem_is_reported_at_once() -> None:
    problems = problems_for(
        ["precision=fp16", "train.lr=0", "strategy=fsdp", "cluster.launcher=deepspeed",
         "train.micro_batch_size=0"]
    )
    text = "\n".join(problems)
    assert len(problems) == 4, problems
    for key in ("precision=fp16", "train.lr=0", "cluster.launcher=deepspeed",
                "train.micro_batch_size=0"):
        assert key in text
