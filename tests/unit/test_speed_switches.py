"""The speed switches (model.attn_implementation, train.liger_kernel, train.compile):
each refusal names the key as typed, its value, why and the fix, before anything starts
(launcher/validation/speed.py); the estimate's logits term under Liger; what the ranks
are handed (the model's attention, TrainingArguments, Ulysses' core attention)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose_config
from launcher.errors import ConfigError
from launcher.estimator.memory import activation_bytes, logits_bytes, training_logits_bytes
from launcher.validation import speed
from launcher.validation.validate import validate


def problems_for(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(overrides), "plan")
    return caught.value.problems


def only_problem(overrides: list[str]) -> str:
    problems = problems_for(overrides)
    assert len(problems) == 1, problems
    return problems[0]


@pytest.fixture
def flash_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU machine with flash-attn, FlashAttention-3 and liger-kernel installed."""
    monkeypatch.setattr(speed, "installed", lambda module: True)


@pytest.fixture
def nothing_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """None in sys.modules: find_spec answers None, as where a package is missing."""
    for module in ("flash_attn", "flash_attn_interface", "liger_kernel"):
        monkeypatch.setitem(sys.modules, module, None)


A100_BF16 = ["cluster.gpu=a100-80g", "precision=bf16"]
H100_BF16 = ["cluster.gpu=h100-80g", "precision=bf16"]


def test_the_default_is_sdpa_and_every_name_is_checked() -> None:
    assert compose_config([]).model.attn_implementation == "sdpa"
    validate(compose_config(["model.attn_implementation=eager"]), "plan")
    message = only_problem(["model.attn_implementation=flash"])
    assert message.startswith("model.attn_implementation=flash: not one of sdpa, eager, "
                              "flash_attention_2, flash_attention_3, flex_attention"), message


@pytest.mark.parametrize("attn", ["flash_attention_2", "flash_attention_3"])
def test_flash_attention_is_refused_on_cpu(attn: str) -> None:
    message = only_problem([f"model.attn_implementation={attn}"])
    assert f"model.attn_implementation={attn} on cluster.gpu=cpu" in message
    assert "CUDA GPUs only" in message and "Fix: model.attn_implementation=sdpa" in message


def test_flash_attention_2_needs_ampere(flash_installed: None) -> None:
    message = only_problem(["model.attn_implementation=flash_attention_2",
                            "cluster.gpu=v100-32g", "precision=fp16"])
    assert "cluster.gpu=v100-32g (compute capability 7.0)" in message
    assert "needs Ampere (compute capability 8.0) or newer" in message
    assert "Fix: model.attn_implementation=sdpa, or cluster.gpu=a100-80g" in message
    validate(compose_config(["model.attn_implementation=flash_attention_2", *A100_BF16]), "plan")


def test_flash_attention_3_needs_hopper(flash_installed: None) -> None:
    message = only_problem(["model.attn_implementation=flash_attention_3", *A100_BF16])
    assert "cluster.gpu=a100-80g (compute capability 8.0)" in message
    assert "needs Hopper" in message
    assert "Fix: model.attn_implementation=sdpa or flash_attention_2, or cluster.gpu=h100-80g" \
        in message
    validate(compose_config(["model.attn_implementation=flash_attention_3", *H100_BF16]), "plan")


def test_flash_attention_needs_half_precision(flash_installed: None) -> None:
    message = only_problem(["model.attn_implementation=flash_attention_2",
                            "cluster.gpu=a100-80g", "precision=fp32"])
    assert "model.attn_implementation=flash_attention_2 with precision=fp32" in message
    assert "Fix: precision=bf16, or model.attn_implementation=sdpa" in message


def test_a_missing_flash_package_names_its_install(nothing_installed: None) -> None:
    message = only_problem(["model.attn_implementation=flash_attention_2", *A100_BF16])
    assert "(the flash_attn module) is not installed" in message
    assert "Fix: pip install flash-attn --no-build-isolation" in message
    message = only_problem(["model.attn_implementation=flash_attention_3", *H100_BF16])
    assert "(the flash_attn_interface module) is not installed" in message
    assert "hopper/" in message and "model.attn_implementation=sdpa" in message


def test_flex_attention_is_refused_on_cpu_only() -> None:
    message = only_problem(["model.attn_implementation=flex_attention"])
    assert "model.attn_implementation=flex_attention on cluster.gpu=cpu" in message
    assert "no backward on CPU" in message and "Fix: model.attn_implementation=sdpa" in message
    validate(compose_config(["model.attn_implementation=flex_attention", *A100_BF16]), "plan")


def test_flex_attention_gets_its_inputs_in_the_autocast_dtype(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under autocast the rotary step hands FlexAttention fp32 queries and keys next to
    bf16 values (measured: launcher/rank/attention.py); after the ranks' registration the
    function a model looks up for flex_attention casts all three, as autocast does for SDPA.
    The kernel is stood in for (FlexAttention compiles its block mask on CPU: ~8 s)."""
    import torch
    from transformers.integrations import flex_attention
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from launcher.rank.attention import cast_flex_inputs

    seen: list[tuple[torch.dtype, ...]] = []

    def kernel(module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               *args: object, **kwargs: object) -> tuple[torch.Tensor, None]:
        seen.append((q.dtype, k.dtype, v.dtype))
        return q.transpose(1, 2), None

    monkeypatch.setattr(flex_attention, "flex_attention_forward", kernel)
    cast_flex_inputs()
    attention = ALL_ATTENTION_FUNCTIONS.get_interface("flex_attention", None)
    q, k = torch.randn(2, 4, 16, 8), torch.randn(2, 2, 16, 8)
    v = k.to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attention(torch.nn.Module(), q, k, v, None, scaling=0.35)
    assert seen == [(torch.bfloat16,) * 3]
    attention(torch.nn.Module(), q, k, k, None)  # no autocast: untouched
    assert seen[-1] == (torch.float32,) * 3


SP = ["strategy=zero3", "parallel.sp=2", "cluster.gpus_per_node=2"]


@pytest.mark.parametrize("attn", ["eager", "flex_attention"])
def test_sequence_parallelism_takes_the_model_attention_sdpa_or_flash(attn: str) -> None:
    validate(compose_config(SP), "plan")
    problems = problems_for([*SP, f"model.attn_implementation={attn}"])
    (ulysses,) = [p for p in problems if "parallel.sp=2" in p]
    assert f"model.attn_implementation={attn} with parallel.sp=2" in ulysses
    assert "Fix: model.attn_implementation=sdpa, or parallel.sp=1" in ulysses


def test_ulysses_core_attention_is_the_model_attention() -> None:
    from launcher.engines.deepspeed.ulysses import parallelism_config

    handler = parallelism_config(2, "flash_attention_2").sp_handler
    assert handler.sp_attn_implementation == "flash_attention_2"


def test_liger_is_refused_on_cpu_and_when_missing(nothing_installed: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    message = only_problem(["train.liger_kernel=true"])
    assert "train.liger_kernel=true on cluster.gpu=cpu" in message
    assert "Fix: train.liger_kernel=false here, or a GPU preset" in message
    message = only_problem(["train.liger_kernel=true", *A100_BF16])
    assert "liger-kernel (the liger_kernel module) is not installed" in message
    assert "Fix: pip install liger-kernel, or train.liger_kernel=false" in message
    monkeypatch.setattr(speed, "installed", lambda module: True)
    validate(compose_config(["train.liger_kernel=true", *A100_BF16]), "plan")


def test_compile_is_accepted_on_cpu() -> None:
    validate(compose_config(["train.compile=true"]), "plan")


def test_the_compile_phase_reads_a_count_that_compiling_moves() -> None:
    """The `compile` start-up phase reads dynamo's private time count
    (callbacks/metrics.compile_seconds): it must exist in this torch and grow when a frame
    compiles (backend eager: dynamo's own work, none of inductor's). The inductor launch is
    `make test-full`'s (tests/integration/test_fake_engine.py)."""
    import torch

    from launcher.rank.callbacks.metrics import compile_seconds

    before = compile_seconds()
    double = torch.compile(lambda x: torch.relu(x) * 2, backend="eager")
    assert double(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    assert compile_seconds() > before


LLAMA_7B = ["model=llama-7b", *A100_BF16, "dataset.max_length=4096", "train.micro_batch_size=2"]


def test_liger_keeps_one_chunk_of_the_logits_in_the_estimate() -> None:
    """Liger's fused linear + cross-entropy: chunks of next_pow2(ceil(T / ceil(V / h)))
    tokens' logits and the input's gradient (T x h), in bf16, instead of the whole logits
    with their fp32 log-softmax."""
    plain, liger = compose_config(LLAMA_7B), compose_config([*LLAMA_7B, "train.liger_kernel=true"])
    tokens, h, vocab = 4096 * 2, 4096, 32000
    rows = 1024  # ceil(32000 / 4096) = 8 chunks: 8192 / 8 = 1024, a power of 2
    assert training_logits_bytes(liger, 4096) == 2 * (rows * vocab + tokens * h)
    assert training_logits_bytes(plain, 4096) == logits_bytes(plain, 4096) == \
        10 * tokens * vocab
    saved = logits_bytes(plain, 4096) - training_logits_bytes(liger, 4096)
    assert activation_bytes(plain) - activation_bytes(liger) == saved
    assert saved > 2.0 * 2**30  # 2.4 GiB of logits no longer held
    # the eval and DPO reference forwards still compute whole logits: logits_bytes unchanged
    assert logits_bytes(liger, 4096) == logits_bytes(plain, 4096)


def test_liger_leaves_dpo_logits_as_they_are() -> None:
    dpo = ["objective=dpo", "dataset=prefs", *LLAMA_7B]
    plain, liger = compose_config(dpo), compose_config([*dpo, "train.liger_kernel=true"])
    assert activation_bytes(liger) == activation_bytes(plain)


class KeywordsOnly:
    """An engine that adds nothing and hands back the TrainingArguments keywords."""

    def trainer_kwargs(self, *args: object) -> dict[str, object]:
        return {}

    def training_arguments(self, kwargs: dict[str, object], *args: object) -> dict[str, object]:
        return kwargs


def test_the_ranks_get_the_switches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TrainingArguments' use_liger_kernel and torch_compile (liger on the cpu preset only
    because validation is skipped here), and the model built with model.attn_implementation."""
    from launcher.data.tokenizer import load_tokenizer
    from launcher.engines import engine_of
    from launcher.rank.model import build_model
    from launcher.rank.training import training_arguments
    from launcher.rundir import RunDir

    cfg = compose_config(["model.attn_implementation=eager", "train.compile=true",
                          "train.liger_kernel=true"])
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path))  # restored afterwards
    kwargs = training_arguments(cfg, KeywordsOnly(), RunDir(tmp_path), True, {}, False)
    assert kwargs["torch_compile"] is True and kwargs["use_liger_kernel"] is True
    model = build_model(cfg, engine_of(cfg.strategy), load_tokenizer(cfg))
    assert model.config._attn_implementation == "eager"
