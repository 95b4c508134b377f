"""peft=lora on 2 CPU ranks under DDP, ZeRO-3 and FSDP2: only the adapters train (every
base tensor bit-identical before and after, every adapter tensor changed, on each rank's
own shard), and the saved model/ is the merged model, loadable without peft, with the
trained model's logits. ddp and zero3 train the tiny MoE with all-linear (EXPERT_LORA:
adapters on the experts' 3-D weights and the router too, merged from their own layout;
zero3's from the gathered state dict), fsdp the tiny Llama. QLoRA: a 4-bit base that
really is 4-bit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from runs import EVIDENCE, EXPERT_LORA, Run, callbacks, describe_failure

from launcher.config.compose import PROJECT_ROOT

pytestmark = pytest.mark.slow


WRAPPED = {
    "ddp": ("PeftModelForCausalLM", "DistributedDataParallel"),
    "zero3": ("PeftModelForCausalLM", "DeepSpeedEngine"),
    "fsdp": ("FSDPPeftModelForCausalLM", "FSDPPeftModelForCausalLM"),
}


# zero3 and fsdp LoRA run in `make test` from a pretrained base (test_pretrained_start.py,
# with the same wrapper, adapter-only and merged-model checks); from config only in
# `make test-full`.
@pytest.mark.parametrize("strategy", [
    "ddp", *[pytest.param(s, marks=pytest.mark.full) for s in ("fsdp", "zero3")]])
def test_lora_trains_adapters_and_saves_a_merged_model(
    trained: Callable[..., Run], strategy: str
) -> None:
    probes = callbacks(*EVIDENCE, "ParamChecksumProbe")
    moe = EXPERT_LORA if strategy != "fsdp" else ()
    run = trained(f"lora-{strategy}-torchrun-fp32",
                  [f"strategy={strategy}", "peft=lora", *moe, probes])
    assert run.returncode == 0, describe_failure(run)
    result = run.result
    assert result["world_size"] == 2
    model_class, wrapped_class = WRAPPED[strategy]
    wrapper = run.probe("wrapper", 0)
    assert wrapper["model_class"] == model_class
    # FSDP2 replaces the module's class in place: there is no separate wrapper object.
    assert wrapper["wrapped_class"] == (None if strategy == "fsdp" else wrapped_class)
    assert_only_adapters_changed(run)
    # Adapters learn slower than full fine-tuning, but they learn.
    assert result["final_eval_loss"] < result["first_eval_loss"] - 0.1, result

    model_dir = run.run_dir / "model"
    assert (model_dir / "adapter" / "adapter_config.json").is_file()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)  # merged: plain weights
    assert type(model).__name__ == ("Qwen3MoeForCausalLM" if moe else "LlamaForCausalLM")
    assert not any("lora" in name for name, _ in model.named_parameters())
    if moe:  # the experts and the router were adapted, and trained
        adapted = [n for n, grad in run.probe("checksums", 0)["requires_grad"].items() if grad]
        assert any(".experts." in n for n in adapted) and any(".gate." in n for n in adapted)
    recorded = run.logits()
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=recorded["input_ids"]).logits.float()
    assert torch.allclose(logits, recorded["logits"], atol=1e-4)


def assert_only_adapters_changed(run: Run) -> None:
    """On every rank's own shard: base weights bit-identical, every LoRA tensor changed.
    (test_pretrained_start.py's LoRA runs assert the same through this function.)"""
    for rank in range(2):
        sums = run.probe("checksums", rank)
        changed = {name for name, digest in sums["begin"].items() if sums["end"][name] != digest}
        adapters = {name for name in sums["begin"] if "lora_" in name}
        assert adapters and changed == adapters, sorted(changed ^ adapters)
        trainable = {name for name, grad in sums["requires_grad"].items() if grad}
        assert trainable == adapters


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Llama to quantize. intermediate_size 192, not the preset's 172: the
    bitsandbytes CPU 4-bit kernel needs output features divisible by its block size."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(PROJECT_ROOT / "assets" / "tokenizer")
    config = AutoConfig.for_model(
        "llama",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=192,
        vocab_size=512,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("base")
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_qlora_trains_on_4bit_base_and_merges_into_full_precision(
    trained: Callable[..., Run], base_model_dir: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = trained(
        "qlora-ddp-torchrun-fp32",
        ["strategy=ddp", "peft=qlora", f"model.path={base_model_dir}", "model.tokenizer=",
         "model.intermediate_size=192", callbacks("WrapperProbe", "LogitsProbe")],
    )
    assert run.returncode == 0, describe_failure(run)
    result = run.result
    assert result["world_size"] == 2
    assert run.probe("wrapper", 0)["base_weights_4bit"] is True
    assert result["final_eval_loss"] < result["first_eval_loss"] - 0.1, result

    recorded = run.logits()
    ids = recorded["input_ids"]
    merged = AutoModelForCausalLM.from_pretrained(run.run_dir / "model").eval()
    base = AutoModelForCausalLM.from_pretrained(base_model_dir)
    adapted = PeftModel.from_pretrained(base, run.run_dir / "model" / "adapter").eval()
    with torch.no_grad():
        merged_logits = merged(input_ids=ids).logits
        adapted_logits = adapted(input_ids=ids).logits
    # The merge is exact against the full-precision base + adapter ...
    assert torch.allclose(merged_logits, adapted_logits, atol=1e-4)
    # ... and close to the 4-bit model that trained (NF4 rounding of the base weights).
    assert (merged_logits - recorded["logits"]).abs().max() < 0.3
