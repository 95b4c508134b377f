"""The one validation stage: each rule's message names the key as typed, the value and the
fix, and every problem of every kind (configuration, strategy, machine, scheduler, resume)
comes back in one ConfigError."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose_config
from launcher.config.hardware import GPU_PRESETS
from launcher.errors import ConfigError
from launcher.launchers.command import build_launch
from launcher.run.planner import make_plan
from launcher.rundir import write_complete_marker
from launcher.validation.preflight import fused_adam_problems, visible_devices
from launcher.validation.validate import Target, validate


def problems_for(overrides: list[str], target: Target = "plan") -> list[str]:
    cfg = compose_config(overrides)
    with pytest.raises(ConfigError) as caught:
        validate(cfg, target)
    return caught.value.problems


def only_problem(overrides: list[str], target: Target = "plan") -> str:
    problems = problems_for(overrides, target)
    assert len(problems) == 1, problems
    return problems[0]


def test_default_config_is_valid_for_every_target(tmp_path: Path) -> None:
    for target in ("estimate", "plan", "train"):
        checked = validate(compose_config([f"run.output_dir={tmp_path}"]), target)
        assert checked.cfg.strategy.name == "ddp" and checked.estimate is not None


def test_fp16_on_cpu_names_precision_and_fix() -> None:
    message = only_problem(["precision=fp16"])
    assert "precision=fp16" in message and "cluster.gpu=cpu" in message
    assert "Fix: precision=bf16 or precision=fp32" in message


def test_fp16_is_accepted_on_every_gpu_preset_and_only_there() -> None:
    base = compose_config(["precision=fp16"])
    accepted = set()
    for gpu in GPU_PRESETS:
        cfg = copy.deepcopy(base)
        cfg.cluster.gpu = gpu
        try:
            accepted.add(validate(cfg, "plan").cfg.cluster.gpu)
        except ConfigError:
            pass
    assert accepted == {"v100-32g", "a100-40g", "a100-80g", "h100-80g", "h200-141g"}


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
    validate(compose_config(overrides), "plan")  # a plan for 2 nodes is fine
    message = only_problem(overrides, "train")
    assert "cluster.nodes=2 with cluster=local" in message
    assert "ftl submit cluster=slurm cluster.nodes=2" in message


def test_local_multi_node_with_deepspeed_hostfile_is_allowed(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=2\nworker-2 slots=2  # second node\n")
    cfg = compose_config(["cluster.nodes=2", "cluster.launcher=deepspeed",
                          f"cluster.hostfile={hostfile}", f"run.output_dir={tmp_path}"])
    launch = build_launch(make_plan(validate(cfg, "train")).cfg, str(tmp_path / "run"))
    # one deepspeed on this machine, starting both nodes from the user's own file
    assert launch.argv[:5] == ["deepspeed", "--hostfile", str(hostfile), "--num_nodes", "2"]
    assert launch.hostfile is None and not launch.per_node


def test_hostfile_must_exist_parse_and_list_every_node(tmp_path: Path) -> None:
    base = ["cluster.nodes=2", "cluster.launcher=deepspeed"]
    missing = only_problem([*base, f"cluster.hostfile={tmp_path}/nope"], "train")
    assert f"cluster.hostfile={tmp_path}/nope: cannot be read" in missing
    bad = tmp_path / "bad"
    bad.write_text("worker-1 slots=two\n")
    assert "line 1 'worker-1 slots=two' is not `host slots=N`" in only_problem(
        [*base, f"cluster.hostfile={bad}"], "train")
    short = tmp_path / "short"
    short.write_text("worker-1 slots=2\n")
    assert "lists 1 host(s), cluster.nodes=2" in only_problem(
        [*base, f"cluster.hostfile={short}"], "train")


def test_deepspeed_multi_node_without_scheduler_needs_a_hostfile() -> None:
    for target in ("plan", "train"):  # once, also when the machine checks run too
        message = only_problem(["cluster.nodes=2", "cluster.launcher=deepspeed"], target)
        assert "deepspeed needs a hostfile" in message and "cluster.hostfile=PATH" in message


def test_train_refuses_a_batch_cluster() -> None:
    message = only_problem(["cluster=slurm", "cluster.gpu=cpu"], "train")
    assert "cluster=slurm" in message and "ftl submit" in message


def test_submit_refuses_a_cluster_without_scheduler() -> None:
    message = only_problem([], "submit")
    assert "cluster=local (cluster.scheduler=none)" in message and "cluster=slurm" in message


def test_train_checks_this_machine_together_with_the_config() -> None:
    problems = problems_for(["cluster.gpu=a100-80g", "train.lr=0"], "train")
    text = "\n".join(problems)
    assert "train.lr=0.0: must be greater than 0" in text
    assert "cluster.gpu=a100-80g: this machine has no NVIDIA GPU" in text


def test_cuda_visible_devices_must_list_the_ranks_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = ["cluster.gpu=a100-80g", "cluster.gpus_per_node=2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    text = "\n".join(problems_for(gpus, "train"))
    assert ("cluster.gpus_per_node=2 with CUDA_VISIBLE_DEVICES=3: 1 GPU(s) visible to the "
            "ranks. Fix: cluster.gpus_per_node=1") in text
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2a,GPU-77c1")
    text = "\n".join(problems_for([*gpus, "cluster.launcher=deepspeed"], "train"))
    assert "DeepSpeed's launcher names GPUs by index" in text
    assert "Fix: cluster.launcher=torchrun" in text
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "CUDA_VISIBLE_DEVICES='' hides every GPU" in "\n".join(problems_for(gpus, "train"))
    # What the launch is given: the ids as listed; nothing on CPU ranks.
    cfg = compose_config([*gpus, "cluster.launcher=deepspeed"])
    assert visible_devices(cfg, {"CUDA_VISIBLE_DEVICES": "5, 2,7"}) == ("5,2,7", [])
    assert visible_devices(cfg, {}) == (None, [])
    assert visible_devices(compose_config([]), {"CUDA_VISIBLE_DEVICES": ""}) == (None, [])


def test_deepspeeds_fused_adam_needs_nvcc_or_a_build(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DeepSpeed on a GPU preset train.optimizer=auto compiles FusedAdam with nvcc at
    the first step: refused where CUDA_HOME holds no nvcc and nothing is built."""
    zero2 = ["cluster.gpu=a100-80g", "strategy=zero2"]
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))  # a runtime-only install
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    text = "\n".join(problems_for(zero2, "train"))
    assert "train.optimizer=auto with strategy=zero2 on cluster.gpu=a100-80g: DeepSpeed's " \
           "FusedAdam is compiled with nvcc" in text and "Fix: train.optimizer=torch" in text
    assert f"(CUDA_HOME={tmp_path / 'cuda'} holds no bin/nvcc)" in text
    for fine in (["train.optimizer=torch"], ["strategy=zero2_offload"], ["strategy=fsdp"]):
        assert "FusedAdam" not in "\n".join(problems_for([*zero2, *fine], "train"))
    built = tmp_path / "ext" / "fused_adam" / "fused_adam.so"  # an earlier JIT build
    built.parent.mkdir(parents=True)
    built.touch()
    assert "FusedAdam" not in "\n".join(problems_for(zero2, "train"))
    built.unlink()
    # A toolkit: fine for a torch of the same CUDA (a CPU torch, as here: not asked), refused
    # across majors, as DeepSpeed refuses to build (its check: the same major among 10-12).
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    compiler = tmp_path / "cuda" / "bin" / "nvcc"
    compiler.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    compiler.chmod(0o755)
    assert "FusedAdam" not in "\n".join(problems_for(zero2, "train"))
    cfg, env = compose_config(zero2), dict(os.environ)
    (mismatch,) = fused_adam_problems(cfg, env, "12.8")
    assert f"with {compiler} (CUDA 13.0) and refuses to for a torch built with CUDA 12.8" \
        in mismatch and "CUDA_HOME set to a CUDA 12 toolkit" in mismatch
    assert fused_adam_problems(cfg, env, "13.0") == []
    assert fused_adam_problems(cfg, {**env, "DS_SKIP_CUDA_CHECK": "1"}, "12.8") == []


@pytest.mark.parametrize(
    "override, shown",
    [
        ("train.micro_batch_size=0", "train.micro_batch_size=0"),
        ("train.grad_accum=-1", "train.grad_accum=-1"),
        ("train.lr=0", "train.lr=0.0"),  # a float key shows the value as parsed
        ("train.lr=-1e-5", "train.lr=-1e-05"),
        ("cluster.nodes=0", "cluster.nodes=0"),
        ("cluster.gpus_per_node=0", "cluster.gpus_per_node=0"),
        ("train.save_steps=0", "train.save_steps=0"),
        ("dataset.max_length=0", "dataset.max_length=0"),
    ],
)
def test_non_positive_values_are_refused(override: str, shown: str) -> None:
    key = override.split("=")[0]
    assert only_problem([override]) == (
        f"{shown}: must be greater than 0. Fix: set {key} to a positive value.")


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


def test_global_batch_that_matches_is_the_batch_deepspeed_gets() -> None:
    overrides = ["strategy=zero2", "cluster.gpus_per_node=2", "train.micro_batch_size=4",
                 "train.grad_accum=4", "train.global_batch_size=32"]
    plan = make_plan(validate(compose_config(overrides), "plan"))
    assert plan.settings["train_batch_size"] == 32


def test_global_batch_not_divisible_explains() -> None:
    overrides = ["cluster.gpus_per_node=2", "train.micro_batch_size=4",
                 "train.global_batch_size=12"]
    message = only_problem(overrides)
    assert "divisible by train.micro_batch_size x data-parallel size (8)" in message


def test_backend_auto_belongs_to_strategy_auto_only() -> None:
    message = only_problem(["strategy=zero2", "strategy.backend=auto"])
    assert message.startswith("strategy.backend=auto with strategy=zero2: auto is not an engine")
    assert "Fix: strategy.backend=ddp|deepspeed|fsdp, or strategy=auto." in message
    auto = validate(compose_config(["strategy=auto", "strategy.backend=fsdp"]), "plan")
    assert auto.cfg.strategy.backend in ("ddp", "fsdp")  # resolved on the fsdp ladder


def test_unknown_choice_lists_the_options() -> None:
    message = only_problem(["cluster.gpu=a100-20g"])
    assert "cluster.gpu=a100-20g" in message
    assert "h100-80g" in message and "v100-32g" in message


def test_unknown_optimizer_is_refused_before_any_builder_runs() -> None:
    message = only_problem(["train.optimizer=adam"])
    assert "train.optimizer=adam: not one of auto, torch" in message


def test_max_length_longer_than_model() -> None:
    message = only_problem(["dataset.max_length=1000"])
    assert "dataset.max_length=1000" in message and "model.max_position_embeddings=256" in message


QLORA_OK = ["peft=qlora", "model.path=/models/base", "model.intermediate_size=192"]


def test_qlora_with_zero3_is_refused() -> None:
    message = only_problem([*QLORA_OK, "strategy=zero3"])
    assert "peft=qlora" in message and "strategy=zero3" in message


def test_qlora_needs_weights_and_cpu_block_sizes() -> None:
    validate(compose_config(QLORA_OK), "plan")
    problems = problems_for(["peft=qlora"])
    assert any("model.path is empty" in p and "peft=lora" in p for p in problems), problems
    assert any("model.intermediate_size=172" in p and "blocks of 32" in p for p in problems)
    validate(compose_config([*QLORA_OK, "model.intermediate_size=160"]), "plan")  # 5 x 32


def test_qlora_without_bitsandbytes_is_refused_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    validate(compose_config(QLORA_OK), "plan")  # installed here: `make venv` adds [qlora]
    # None in sys.modules: find_spec answers None, as in an environment without the extra
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    message = only_problem(QLORA_OK)
    assert "peft=qlora" in message and "bitsandbytes" in message, message
    assert "pip install 'ftlaunch[qlora]'" in message and "peft=lora" in message, message
    validate(compose_config(["peft=lora"]), "plan")  # LoRA does not need it


def test_eight_bit_base_is_refused_not_silently_loaded_in_4_bit() -> None:
    message = only_problem([*QLORA_OK, "peft.bits=8"])
    assert "peft.bits=8 with peft=qlora" in message and "Fix: peft.bits=4" in message
    assert "peft.bits=4 with peft=lora" in only_problem(["peft=lora", "peft.bits=4"])


NO_EVAL = ["dataset.eval_path=", "dataset.eval_fraction=0"]


@pytest.mark.parametrize(("typed", "off"), [
    ("train.eval_steps=10", "train.eval_steps=0"),
    ("train.eval_on_start=true", "train.eval_on_start=false"),
    ("train.show_examples=5", "train.show_examples=0"),
])
def test_evaluation_the_user_typed_without_an_eval_set_is_refused(
    typed: str, off: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The preset's other two turn off (compose.preset_evaluation_off); the typed one is
    refused, naming key, value and the fix for it alone."""
    message = only_problem([*NO_EVAL, typed], "train")
    assert message.startswith(f"{typed}: there is no eval set"), message
    assert message.endswith(f"dataset.eval_fraction, or {off} to train without evaluation.")
    notice = capsys.readouterr().err
    assert notice.count("turned off") == 1 and typed.split("=")[0] not in notice, notice
    validate(compose_config([*NO_EVAL, off]), "plan")


def test_two_typed_evaluation_settings_are_refused_together() -> None:
    message = only_problem([*NO_EVAL, "train.eval_steps=7", "train.eval_on_start=true"])
    assert ("train.eval_steps=7 and train.eval_on_start=true: there is no eval set"
            in message), message
    assert "or train.eval_steps=0 train.eval_on_start=false to train without" in message


def test_preprocess_checks_only_what_preprocessing_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training's rules do not refuse `ftl preprocess`; the data's do, for every target."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no hub: a missing source is a problem
    training = [
        "precision=fp16", "train.global_batch_size=7", "model.num_heads=3",
        "dataset.max_length=1024",  # > tiny-llama's 256 positions: the model's, not the data's
        "train.eval_steps=10", "train.eval_on_start=true", "train.show_examples=-1",
        "train.callbacks=[{_target_: no_such_module.Callback}]", "run.name=../x",
        "train.lr=0", "train.hang_timeout_s=10", "train.first_step_timeout_s=1",
        "train.report_to=[nonsense]", "model.path=/no/such/model",  # tokenizer: assets/
    ]
    overrides = [*NO_EVAL, f"run.output_dir={tmp_path}", *training]
    validate(compose_config(overrides), "preprocess")
    refused = "\n".join(problems_for(overrides, "plan"))
    for override in training[:-1]:
        assert override.split("=")[0] in refused, (override, refused)
    data = ["dataset.format=tsv", "dataset.max_length=0", "dataset.eval_fraction=1.5",
            "dataset.name=a/b", "train.micro_batch_size=0", "cluster.gpus_per_node=0"]
    for override in data:
        assert override.split("=")[0] in only_problem([override], "preprocess"), override
    no_tokenizer = only_problem(["model.tokenizer=", "model.path=/no/such/model"],
                                "preprocess")
    assert no_tokenizer.startswith("model.path=/no/such/model: not found"), no_tokenizer


def test_a_negative_number_of_examples_is_refused() -> None:
    assert "train.show_examples=-1: a number of held-out prompts, >= 0" in only_problem(
        ["train.show_examples=-1"])


def test_a_tokenizer_source_is_required() -> None:
    message = only_problem(["model.tokenizer="])
    assert "model.tokenizer: empty, and model.path is empty too" in message


def test_callbacks_need_an_importable_target() -> None:
    ok = "train.callbacks=[{_target_:transformers.PrinterCallback}]"
    validate(compose_config([ok]), "plan")
    message = only_problem(["train.callbacks=[{_target_:nowhere.Probe}]"])
    assert "train.callbacks[0]._target_=nowhere.Probe" in message
    assert "needs _target_" in only_problem(["train.callbacks=[{step:4}]"])


def checkpoint(root: Path, step: int, world_size: int = 2, complete: bool = True) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        write_complete_marker(path, step, world_size=world_size)
    return path


def test_resume_path_must_exist_and_be_complete(tmp_path: Path) -> None:
    out = f"run.output_dir={tmp_path}"
    missing = only_problem([out, f"run.resume={tmp_path}/checkpoint-9"], "train")
    assert "no such checkpoint directory" in missing
    half = checkpoint(tmp_path / "a", 2, complete=False)
    assert "has no COMPLETE marker" in only_problem([out, f"run.resume={half}"], "train")
    # Another world size loads: DDP state is whole, FSDP's is resharded, ZeRO's converted
    # to a universal checkpoint by the ranks (tests/integration/test_world_size_change.py).
    four_ranks = checkpoint(tmp_path / "b", 4, world_size=4)
    for strategy in ("ddp", "zero2", "zero3", "fsdp"):
        overrides = [out, f"strategy={strategy}", f"run.resume={four_ranks}"]
        assert validate(compose_config(overrides), "train").resume_from == four_ranks


def test_auto_finds_an_earlier_unfinished_launch(tmp_path: Path) -> None:
    earlier = checkpoint(tmp_path / "tiny-llama-ddp" / "20260101-000000" / "checkpoints", 4)
    checked = validate(compose_config([f"run.output_dir={tmp_path}"]), "train")
    assert checked.resume_from == earlier
    never = validate(compose_config([f"run.output_dir={tmp_path}", "run.resume=never"]), "train")
    assert never.resume_from is None


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


def test_names_that_become_folders_stay_inside_their_root(tmp_path: Path) -> None:
    problems = problems_for(
        ["run.name=../x", "dataset.name=/tmp/data", f"run.output_dir={tmp_path}"], "train")
    assert problems == [
        "run.name='../x' leaves run.output_dir (the run dir is run.output_dir/run.name/<time>). "
        "Fix: a plain name such as run.name=x.",
        "dataset.name='/tmp/data' leaves the data cache (dataset.cache_dir/dataset.name-<key>). "
        "Fix: a plain name such as dataset.name=tmp-data.",
    ]
    for name, plain in [("/abs/run", "abs-run"), ("a/b", "a-b"), ("..", "my-run"),
                        ("''", "my-run"), ("a/../../b", "a-b")]:
        message = only_problem([f"run.name={name}"])
        assert f"Fix: a plain name such as run.name={plain}." in message, message
    validate(compose_config(["run.name=my.run-2", f"run.output_dir={tmp_path}"]), "plan")
    assert not any(tmp_path.iterdir())
