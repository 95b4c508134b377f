"""Mixtures of experts as a model kind: what the estimator counts (compute from the active
parameters, memory from all, LoRA from what peft really wraps), the rules, the ZeRO-3 leaf
modules and the router's aux_loss, each on a tiny model built here (no launch)."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from launcher.config.architecture import active_params, count_params, largest_layer_params
from launcher.config.compose import compose_config
from launcher.config.schema import RunConfig
from launcher.data.tokenizer import load_tokenizer
from launcher.engines import engine_of
from launcher.engines.deepspeed.leaf_modules import mark_expert_blocks
from launcher.engines.final_model import (
    merge_lora_state_dict,
    unquantized_base,
    wrapped_parameters,
)
from launcher.estimator.estimate import estimate
from launcher.estimator.estimate_table import render_estimate_table
from launcher.estimator.flops import adapter_params, flops_per_token, lora_coverage, run_flops
from launcher.estimator.memory import (
    engine_model_state_parts,
    expert_lora_bytes,
    layer_activation_elements,
    lora_activation_bytes,
    model_state_bytes,
)
from launcher.rank.callbacks.router_loss import RouterAuxLoss
from launcher.rank.model import apply_peft, model_config
from launcher.validation.rules import config_problems, strategy_problems

MIXTRAL = ("model.architecture=mixtral", "model.decoder_layer=MixtralDecoderLayer")


def cfg_for(*overrides: str) -> RunConfig:
    return compose_config(["model=tiny-moe", *overrides])


def built(cfg: RunConfig) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(model_config(cfg, load_tokenizer(cfg)))


# ------------------------------------------------------------------ what peft wraps


@pytest.mark.parametrize("arch", [(), MIXTRAL], ids=["qwen3_moe", "mixtral"])
def test_lora_on_an_moe_model_adapts_attention_only_as_counted(arch: tuple[str, ...]) -> None:
    """peft 0.21 on transformers 5's fused experts: the attention's nn.Linear by name, the
    experts and the router frozen; adapter_params is what peft adds; a backward works."""
    cfg = cfg_for(*arch, "peft=lora", "peft.r=8")
    assert config_problems(cfg) == []
    model = apply_peft(built(cfg), cfg)
    assert model.get_nb_trainable_parameters()[0] == adapter_params(cfg)
    assert not model.peft_config["default"].target_parameters
    assert "experts of each layer and its router stay frozen" in lora_coverage(cfg)
    ids = torch.randint(0, 512, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert not any(p.requires_grad for n, p in model.named_parameters() if "mlp" in n)


ALL_LINEAR = ("peft=lora", "peft.r=8", "peft.target_modules=[all-linear]")


@pytest.mark.parametrize("arch", [(), MIXTRAL], ids=["qwen3_moe", "mixtral"])
def test_all_linear_adapts_the_experts_and_merges_as_peft_does(arch: tuple[str, ...]) -> None:
    """all-linear on transformers 5's fused experts: peft 0.21 adapts the attention's
    nn.Linear and, as parameters (ParamWrapper, no dropout: the preset's turns off), the
    experts' 3-D gate_up_proj (rank 2r) and down_proj and the router. adapter_params is
    what peft adds; the merged weights ftl writes answer as peft's own merge_and_unload."""
    cfg = cfg_for(*arch, *ALL_LINEAR)
    assert cfg.peft.dropout == 0 and config_problems(cfg) == []
    assert "each of the 4 experts' gate_up_proj and down_proj and the router" in lora_coverage(cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = apply_peft(built(cfg), cfg)
    # peft's false "rank_pattern keys ... were ignored": the 2r adapters are counted below
    assert not [w for w in caught if "pattern keys did not match" in str(w.message)]
    config = model.peft_config["default"]
    assert set(config.target_parameters) == {"gate_up_proj", "down_proj", "gate.weight"}
    assert set(config.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert model.get_nb_trainable_parameters()[0] == adapter_params(cfg)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: a merge would change nothing
            nn.init.normal_(param, std=0.1)
    ids = torch.randint(0, 512, (2, 16))
    merged = merge_lora_state_dict(model.state_dict(), 32 / 8, copy=True,
                                   wrapped=wrapped_parameters(model))
    plain = built(cfg_for(*arch))
    plain.load_state_dict(merged, strict=True)  # every key, none left over
    with torch.no_grad():
        ours = plain(ids).logits
        theirs = model.merge_and_unload()(ids).logits
        base = built(cfg_for(*arch))(ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert (ours - base).abs().max() > 1e-2  # the experts' adapters did change the model


def test_qlora_merges_into_the_base_as_the_model_names_it(tmp_path: Path) -> None:
    """QLoRA merges into the unquantized base read from model.path. save_pretrained writes
    an MoE layer's experts per expert (experts.0.gate_proj, ...); the base comes back
    through transformers with the fused names the adapters' merge looks up (a raw read of
    the file failed on experts.gate_up_proj). Only attention is quantized, so the CPU
    kernel's blocks of 32 do not bind one expert's width."""
    from safetensors import safe_open

    cfg = cfg_for(*ALL_LINEAR)
    model = built(cfg)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as saved:
        assert "model.layers.0.mlp.experts.0.gate_proj.weight" in set(saved.keys())
    base = unquantized_base(str(tmp_path))
    assert set(base) == set(model.state_dict())  # fused, as the modules hold them
    peft_model = apply_peft(built(cfg), cfg)
    merged = merge_lora_state_dict(peft_model.state_dict(), 4.0, base, copy=False,
                                   wrapped=wrapped_parameters(peft_model))
    assert merged.keys() == base.keys()
    qlora = strategy_problems(cfg_for("peft=qlora", f"model.path={tmp_path}"))
    assert not any("model.intermediate_size" in p for p in qlora), qlora
    odd = strategy_problems(cfg_for("peft=qlora", f"model.path={tmp_path}",
                                    "model.hidden_size=72"))  # an attention width: flagged
    assert any("model.hidden_size=72 with peft=qlora" in p for p in odd), odd


def test_adapted_experts_keep_what_the_estimate_adds() -> None:
    """The activations all-linear keeps over attention-only LoRA (both without dropout),
    counted with saved-tensor hooks on one forward: each layer's experts and router weights
    with the update added (memory.expert_lora_bytes), the unfrozen experts' activations and
    the router's input; the estimate's difference within 2 % (measured: 0.4 %)."""
    common = ("peft=lora", "peft.r=8", "peft.dropout=0", "dataset.max_length=32",
              "train.micro_batch_size=4")
    attention, experts = cfg_for(*common), cfg_for(*common, "peft.target_modules=[all-linear]")
    measured = saved_bytes(experts) - saved_bytes(attention)
    predicted = lora_activation_bytes(experts) - lora_activation_bytes(attention)
    assert expert_lora_bytes(experts) == 4 * 2 * (4 * 3 * 64 * 88 + 64 * 4)
    assert predicted == pytest.approx(measured, rel=0.02)


def test_adapted_experts_pay_their_weight_gradients_and_dropout_turns_off(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Compute: a frozen base's 4 FLOPs per parameter and token, + 2 for the weight
    gradient of each expert a token reaches and of the router. The peft preset's dropout
    turns off with one line; a typed one stays (refused: the rules below)."""
    cfg = cfg_for(*ALL_LINEAR, "train.max_steps=10")
    assert "the preset's peft.dropout=0.05 turned off" in capsys.readouterr().err
    m = cfg.model
    grads = m.num_layers * (2 * 3 * 64 * 88 + 64 * 4)  # k experts of 3hi, the router's hE
    assert flops_per_token(cfg) == 4 * active_params(m) + 2 * grads
    assert "(4PD + 2 x 68.10K x D)" in render_estimate_table(cfg, estimate(cfg), "ddp")
    assert cfg_for(*ALL_LINEAR, "peft.dropout=0.1").peft.dropout == 0.1
    assert "turned off" not in capsys.readouterr().err


def saved_bytes(cfg: RunConfig) -> int:
    """Bytes of the tensors one training forward keeps for backward, parameters left out."""
    model = apply_peft(built(cfg), cfg)
    kept: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, 512, (cfg.train.micro_batch_size, cfg.dataset.max_length))
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        model(input_ids=ids, labels=ids)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(size for ptr, size in kept.items() if ptr not in params)


def test_all_linear_reaches_peft_as_its_string_on_a_dense_model_too() -> None:
    """A list ["all-linear"] is a module name to peft (none found): the worker passes
    the string, and all seven linears get adapters."""
    cfg = compose_config(["model=tiny-llama", "peft=lora", "peft.r=8",
                          "peft.target_modules=[all-linear]"])
    model = apply_peft(built(cfg), cfg)
    assert model.get_nb_trainable_parameters()[0] == adapter_params(cfg)
    assert lora_coverage(cfg) == ""  # dense: nothing to say


# ------------------------------------------------------------------ the estimate


def test_compute_counts_active_parameters_memory_counts_all() -> None:
    cfg = cfg_for("train.max_steps=10")
    m = cfg.model
    assert run_flops(cfg, 1000) == 6.0 * active_params(m) * 1000
    assert flops_per_token(cfg) == 6.0 * active_params(m)
    assert active_params(m) < count_params(m)
    states, _ = model_state_bytes(cfg, cfg.strategy)  # ddp, fp32: 4 + 8 + 8 bytes each
    assert states == 20 * count_params(m)
    est = estimate(cfg)
    assert est.params == count_params(m)
    assert est.flops == 6.0 * active_params(m) * est.tokens
    table = render_estimate_table(cfg, est, "ddp")
    assert "166.78K active per token: 2 of 4 experts" in table.splitlines()[0]


def test_an_moe_layer_keeps_its_routed_experts_activations() -> None:
    """Per token: 2h (norm outputs) + 6 x query width + 2 x KV width, and for each of
    its k experts 4i + 2h (the dense MLP's plus the gathered input and the unweighted
    output), the router's logits and softmax 2E."""
    m = cfg_for().model
    h, i, k, e = 64, 88, 2, 4
    assert layer_activation_elements(m) == 2 * h + 6 * h + 2 * h + k * (4 * i + 2 * h) + 2 * e


def test_qwen3_30b_a3b_states_are_the_whole_model_and_zero3_gathers_the_experts() -> None:
    cfg = compose_config(["model=qwen3-30b-a3b", "cluster.gpu=h100-80g", "precision=bf16",
                          "cluster.gpus_per_node=8", "train.max_steps=10"])
    est = estimate(cfg)
    zero3 = est.row("zero3")
    assert zero3 is not None
    # ZeRO-3's working set: one experts module, 128 x 3 x 2048 x 768 (16-bit params + grads)
    experts = 128 * 3 * 2048 * 768
    assert largest_layer_params(cfg.model) == experts
    parts = engine_model_state_parts(count_params(cfg.model), experts, 8, 3, param_bytes=2)
    assert parts["gathered"] == 2 * 2 * experts
    # gathered in the forward and backward, released before the optimizer step, whose
    # states are the table's
    assert zero3.moments["forward_backward"] - zero3.moments["between_steps"] >= parts["gathered"]
    assert zero3.model_state_gpu_bytes == sum(parts.values()) - parts["gathered"]


# ------------------------------------------------------------------ the rules


@pytest.mark.parametrize(("overrides", "needle"), [
    (("model.num_experts=1",), "model.num_experts=1: a mixture needs 2 or more experts"),
    (("model.experts_per_token=5",), "model.experts_per_token=5 with model.num_experts=4"),
    (("model.experts_per_token=0",), "model.experts_per_token=0 with model.num_experts=4"),
    (("model.num_experts=0",), "model.experts_per_token=2 with model.num_experts=0"),
    (("model.num_experts=0", "model.experts_per_token=0"),
     "model.architecture=qwen3_moe with model.num_experts=0"),
    (("model.architecture=llama",), "model.num_experts=4 with model.architecture=llama"),
    (("model.head_dim=-8",), "model.head_dim=-8: the width of one attention head"),
    (("model.intermediate_size=86",), "model.intermediate_size=86 with model.num_experts=4"),
    (("parallel.tp=2", "strategy=zero1"), "parallel.tp=2 with model=tiny-moe"),
    (("parallel.sp=2", "strategy=zero3"), "parallel.sp=2 with model=tiny-moe"),
    (("peft=lora", "peft.target_modules=[q_proj,gate_proj]"),
     "peft.target_modules=[q_proj,gate_proj] with model=tiny-moe"),
    (("peft=lora", "peft.target_modules=[all-linear]", "peft.dropout=0.1"),
     "peft.dropout=0.1 with peft.target_modules=[all-linear] on model=tiny-moe"),
])
def test_bad_moe_numbers_are_refused_naming_key_value_and_fix(
        overrides: tuple[str, ...], needle: str) -> None:
    problems = config_problems(cfg_for(*overrides))
    hits = [p for p in problems if needle in p]
    assert hits and all("Fix:" in p for p in hits), problems


def test_head_dim_lifts_the_heads_divide_hidden_rule() -> None:
    odd = ("model.num_heads=3",)
    assert any("model.num_heads=3: must divide" in p for p in config_problems(cfg_for(*odd)))
    assert config_problems(cfg_for(*odd, "model.num_kv_heads=3", "model.head_dim=16")) == []


# ------------------------------------------------------------------ ZeRO-3 leaf modules


class ToyExpertsBlock(nn.Module):
    """A remote-code MoE block: a router and a list of expert MLPs."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 3, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
                                     for _ in range(3))


class FusedBlock(nn.Module):
    """transformers 5's layout: the experts one module (not a list)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.Linear(8, 8)


def toy_model() -> nn.Module:
    return nn.Sequential(nn.ModuleDict({"mlp": ToyExpertsBlock()}),
                         nn.ModuleDict({"mlp": ToyExpertsBlock()}), FusedBlock())


def test_blocks_holding_a_list_of_experts_become_zero3_leaf_modules() -> None:
    from deepspeed.utils import z3_leaf_module

    model = toy_model()
    assert mark_expert_blocks(model) == ["ToyExpertsBlock"]
    blocks = [m for m in model.modules() if isinstance(m, ToyExpertsBlock)]
    assert len(blocks) == 2 and all(z3_leaf_module(b) for b in blocks)
    assert not any(z3_leaf_module(m) for m in model.modules() if not isinstance(
        m, ToyExpertsBlock))
    assert mark_expert_blocks(model) == []  # marked already: nothing more


def test_only_zero3_marks_them_and_says_which(capsys: pytest.CaptureFixture[str]) -> None:
    for strategy, marked in (("zero2", False), ("zero3", True)):
        cfg, model = cfg_for(f"strategy={strategy}"), toy_model()
        engine_of(cfg.strategy).prepare_model(cfg, model)
        assert getattr(model[0]["mlp"], "_z3_leaf", False) == marked
    assert capsys.readouterr().out.count("ZeRO-3 leaf modules") == 1


# ------------------------------------------------------------------ the router's loss


def test_aux_loss_is_logged_from_training_forwards_only() -> None:
    cfg = cfg_for()
    model = built(cfg)
    assert model.config.output_router_logits  # the forward adds it to the loss
    trainer = SimpleNamespace(model=model, callback_handler=SimpleNamespace(callbacks=["m"]))
    callback = RouterAuxLoss.install(trainer)
    assert trainer.callback_handler.callbacks == [callback, "m"]  # ahead of MetricsCallback
    ids = torch.randint(0, 512, (2, 16))
    model.train()
    seen = [model(input_ids=ids, labels=ids).aux_loss.item() for _ in range(2)]
    model.eval()
    with torch.no_grad():
        model(input_ids=ids, labels=ids)  # an evaluation: not counted
    args = state = control = None
    logs: dict[str, float] = {"loss": 1.0}
    callback.on_log(args, state, control, logs=logs)
    assert logs["aux_loss"] == pytest.approx(sum(seen) / 2)
    assert 1.0 <= logs["aux_loss"] <= 4.0  # k = 2 when balanced, E = 4 at worst
    quiet: dict[str, float] = {"train_loss": 1.0}  # the summary: no training loss key
    callback.on_log(args, state, control, logs=quiet)
    assert "aux_loss" not in quiet


# ------------------------------------------------------------------ resuming the experts


def test_a_ddp_resume_reads_the_experts_the_trainers_own_load_drops(tmp_path: Path) -> None:
    """save_pretrained writes the experts per expert (the hub layout); the Trainer's
    load_state_dict(strict=False) of that file leaves them as built. An engine that shards
    nothing reads the checkpoint through from_pretrained first; the sharding ones resume
    their own files and do nothing here."""
    from safetensors.torch import load_file

    cfg = cfg_for()
    trained_model = built(cfg)
    with torch.no_grad():
        for name, param in trained_model.named_parameters():
            param.add_(0.01 * (hash(name) % 7 + 1))  # "trained": unlike any fresh build
    trained_model.save_pretrained(tmp_path)
    assert any(".experts.0.gate_proj" in key for key in load_file(tmp_path / "model.safetensors"))
    for strategy, restores in (("ddp", True), ("fsdp", False), ("zero2", False)):
        fresh = built(cfg)
        engine_of(cfg_for(f"strategy={strategy}").strategy).prepare_model(cfg, fresh, tmp_path)
        fresh.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)  # Trainer
        want = trained_model.state_dict()
        same = [torch.equal(value, want[key]) for key, value in fresh.state_dict().items()]
        assert all(same) == restores, strategy
