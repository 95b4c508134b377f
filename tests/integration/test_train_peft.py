"""peft=lora on 2 CPU ranks under DDP, ZeRO-3 and FSDP2: only the adapters train, and the
saved model/ is the merged model, loadable without peft, with the trained model's logits."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from runs import Run, describe_failure

pytestmark = pytest.mark.slow


WRAPPED = {
    "ddp": ("PeftModelForCausalLM", "DistributedDataParallel"),
    "zero3": ("PeftModelForCausalLM", "DeepSpeedEngine"),
    "fsdp": ("FSDPPeftModelForCausalLM", "FSDPPeftModelForCausalLM"),
}


@pytest.mark.parametrize("strategy", sorted(WRAPPED))
def test_lora_trains_adapters_and_saves_a_merged_model(
    trained: Callable[..., Run], strategy: str
) -> None:
    run = trained(f"lora-{strategy}-torchrun-fp32", [f"strategy={strategy}", "peft=lora"])
    assert run.returncode == 0, describe_failure(run)
    result = run.result
    assert result["world_size"] == 2
    model_class, wrapped_class = WRAPPED[strategy]
    assert result["wrapper"]["model_class"] == model_class
    assert result["wrapper"]["wrapped_class"] == wrapped_class
    # Adapters on the attention projections only learn slower than full fine-tuning, but they learn.
    assert result["final_eval_loss"] < result["initial_eval_loss"] - 0.1, result

    model_dir = run.run_dir / "model"
    assert (model_dir / "adapter" / "adapter_config.json").is_file()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)  # merged: plain Llama weights
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not any("lora" in name for name, _ in model.named_parameters())
    recorded = torch.load(run.run_dir / "final_logits.pt")
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=recorded["input_ids"]).logits.float()
    assert torch.allclose(logits, recorded["logits"], atol=1e-4)
