"""Estimator figures against published counts, DeepSpeed's own estimators and bytes measured
on live engines; the predicted peak against measured bytes is in
tests/unit/test_peak_memory.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.config.architecture import (
    count_params,
    largest_layer_params,
    layer_linear_params,
    rank_params,
)
from launcher.config.compose import compose_config
from launcher.config.hardware import GPU_PRESETS
from launcher.config.schema import RunConfig, StrategyConfig
from launcher.config.strategies import concrete_strategies
from launcher.engines.deepspeed.ops import use_own_build_cache
from launcher.estimator.auto import chosen_strategy
from launcher.estimator.estimate import estimate
from launcher.estimator.estimate_table import estimate_json, render_estimate_table
from launcher.estimator.flops import (
    adapter_params,
    flops_per_token,
    peak_flops_per_device,
    run_flops,
    run_seconds,
    training_flops,
    training_tokens,
)
from launcher.estimator.memory import (
    GIB,
    activation_bytes,
    engine_model_state_parts,
    layer_activation_elements,
    model_state_bytes,
)

TABLE = concrete_strategies()


def strategy(name: str) -> StrategyConfig:
    """The table's entry for `name` (configs/strategy/<name>.yaml)."""
    return TABLE[name]


def table_text(cfg: RunConfig) -> str:
    """What `ftl estimate` prints: one estimate, the choice read from it."""
    est = estimate(cfg)
    return render_estimate_table(cfg, est, chosen_strategy(cfg, est))


def cfg_for(*overrides: str):
    return compose_config(list(overrides))


# ------------------------------------------------------------------ parameters


@pytest.mark.parametrize(
    "model, published",
    [
        # exact counts of the HF checkpoints (model.num_parameters())
        ("llama-7b", 6_738_415_616),
        ("llama-13b", 13_015_864_320),
        ("llama-70b", 68_976_648_192),
        ("mistral-7b", 7_241_732_096),
    ],
)
def test_param_count_matches_published(model: str, published: int) -> None:
    assert count_params(cfg_for(f"model={model}").model) == published


def test_rounded_param_counts_match_model_cards() -> None:
    cards = {"llama-7b": 6.74e9, "llama-13b": 13.0e9, "llama-70b": 69.0e9, "mistral-7b": 7.24e9}
    for model, card in cards.items():
        assert count_params(cfg_for(f"model={model}").model) == pytest.approx(card, rel=5e-3)


@pytest.mark.parametrize(
    "arch, kv_heads, tie, vocab",
    [("llama", 4, False, 512), ("mistral", 2, False, 512), ("qwen2", 2, True, 512),
     ("qwen2", 4, False, 32)],  # vocab 32: a biased q_proj is the largest module
)
def test_param_count_and_largest_layer_match_a_real_hf_model(
    arch: str, kv_heads: int, tie: bool, vocab: int
) -> None:
    """Build the HF model from the same numbers; DeepSpeed's model_to_params counts it."""
    import transformers
    from deepspeed.runtime.zero.stage3 import model_to_params

    cfg = cfg_for(
        "model=tiny-llama", f"model.architecture={arch}", f"model.num_kv_heads={kv_heads}",
        f"model.tie_word_embeddings={str(tie).lower()}", f"model.vocab_size={vocab}",
        "model.intermediate_size=48",
    )
    m = cfg.model
    config = transformers.AutoConfig.for_model(
        arch, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, num_key_value_heads=m.num_kv_heads,
        intermediate_size=m.intermediate_size, vocab_size=m.vocab_size,
        max_position_embeddings=m.max_position_embeddings, tie_word_embeddings=tie,
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    total, largest = model_to_params(model)
    assert count_params(m) == total
    assert largest_layer_params(m) == largest


def test_largest_layer_of_llama_7b_is_the_embedding() -> None:
    assert largest_layer_params(cfg_for("model=llama-7b").model) == 32000 * 4096


# ------------------------------------------------------------------ model states
# DeepSpeed's own estimators (estimate_zero2/3_model_states_mem_needs) are the published
# reference for 16-bit ZeRO; the engine accounting agrees with them except for the 16-bit
# partition they leave out of ZeRO-3 (launcher/estimator/memory.py ENGINE_ACCOUNTING_NOTES).


def engine_gib(stage: int, offload_optimizer: bool = False, offload_param: bool = False) -> float:
    """The engine accounting for 6.74e9 params, largest layer 131M, 8 GPUs, 16-bit."""
    parts = engine_model_state_parts(6_740_000_000, 131_072_000, 8, stage, offload_optimizer,
                                     offload_param, param_bytes=2)
    return round(sum(parts.values()) / GIB, 2)


def test_engine_accounting_matches_what_deepspeed_printed_for_7b_on_8_gpus() -> None:
    """DeepSpeed's estimators for 6.74e9 params, largest layer 131M, 1x8 (docs/evidence/stack.md):
    ZeRO-2 26.68 GiB per GPU, 12.55 with optimizer offload; ZeRO-3 14.61, 2.06 with optimizer
    offload, 0.49 with both offloaded."""
    assert engine_gib(2) == 26.68 and engine_gib(2, True) == 12.55
    assert engine_gib(3, True) == 2.06 and engine_gib(3, True, True) == 0.49
    # ZeRO-3 without offload: + the 16-bit partition DeepSpeed leaves out (2 psi / 8)
    assert engine_gib(3) == round(14.61 + 2 * 6_740_000_000 / 8 / GIB, 2) == 16.18


@pytest.mark.parametrize("nodes", [1, 4])
def test_engine_accounting_equals_deepspeeds_zero2_estimator_in_16_bit(nodes: int) -> None:
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cfg = cfg_for("model=llama-13b", "precision=bf16", f"cluster.nodes={nodes}",
                  "cluster.gpus_per_node=8")
    psi = count_params(cfg.model)
    for name, offload in (("zero2", False), ("zero2_offload", True)):
        _, gpu = estimate_zero2_model_states_mem_needs(
            psi, num_gpus_per_node=8, num_nodes=nodes, cpu_offload=offload)
        assert model_state_bytes(cfg, strategy(name))[0] == pytest.approx(gpu, rel=1e-9), name


@pytest.mark.parametrize("nodes", [1, 2])
def test_engine_accounting_adds_the_16bit_partition_deepspeed_leaves_out_of_zero3(
    nodes: int
) -> None:
    """ENGINE_ACCOUNTING_NOTES: DeepSpeed's zero3 function says 4L + 18*psi/N, the engine
    holds 4L + 20*psi/N in 16-bit (psi/N below sub_group_size); offloaded, they agree."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    cfg = cfg_for("model=llama-7b", "precision=bf16", f"cluster.nodes={nodes}",
                  "cluster.gpus_per_node=8")
    psi, largest = count_params(cfg.model), largest_layer_params(cfg.model)

    def deepspeed_gpu(offload_optimizer: bool, offload_param: bool) -> int:
        return estimate_zero3_model_states_mem_needs(
            psi, largest, num_gpus_per_node=8, num_nodes=nodes,
            cpu_offload=offload_optimizer, cpu_offload_params=offload_param)[1]

    engine = model_state_bytes(cfg, strategy("zero3"))[0]
    assert engine - deepspeed_gpu(False, False) == pytest.approx(2 * psi / (8 * nodes), abs=1)
    optimizer_only = StrategyConfig(name="zero3", backend="deepspeed", zero_stage=3,
                                    offload_optimizer=True)
    assert model_state_bytes(cfg, optimizer_only)[0] == pytest.approx(
        deepspeed_gpu(True, False), abs=1)
    assert model_state_bytes(cfg, strategy("zero3_offload"))[0] == deepspeed_gpu(True, True)


@pytest.mark.parametrize(
    "stage, precision, world, measured",
    [
        # bytes per parameter a live DeepSpeed 0.19.8 engine held as the optimizer step
        # began (tiny Llama, 164,672 params; every live tensor summed; see estimate.py)
        (1, "fp32", 2, 12.0013), (2, "fp32", 2, 12.0013), (3, "fp32", 2, 12.1009),
        (1, "bf16", 2, 10.0013), (2, "bf16", 2, 10.0013), (3, "bf16", 2, 10.0510),
        (1, "bf16", 1, 18.0013), (3, "bf16", 1, 20.0510), (3, "fp32", 1, 24.1009),
        (1, "fp32", 1, 20.0013), (2, "bf16", 4, 6.0013),
    ],
)
def test_engine_accounting_matches_measured_engine(
    stage: int, precision: str, world: int, measured: float
) -> None:
    model = cfg_for("model=tiny-llama").model
    psi = count_params(model)
    parts = engine_model_state_parts(
        psi, largest_layer_params(model), world, stage, param_bytes=4 if precision == "fp32" else 2
    )
    held = parts["params"] + parts["grads"] + parts["optimizer"]
    assert held / psi == pytest.approx(measured, rel=0.02)


def test_fp32_costs_more_than_bf16() -> None:
    for name in ("zero1", "zero3"):
        fp32 = model_state_bytes(cfg_for("precision=fp32"), strategy(name))[0]
        bf16 = model_state_bytes(cfg_for("precision=bf16"), strategy(name))[0]
        assert fp32 > bf16


def test_more_sharding_needs_less_gpu_memory() -> None:
    cfg = cfg_for("model=llama-13b", "precision=bf16", "cluster.gpus_per_node=8")
    order = ["ddp", "zero1", "zero3", "zero3_offload"]
    states = [model_state_bytes(cfg, strategy(n))[0] for n in order]
    assert states == sorted(states, reverse=True)


def test_offload_needs_host_memory() -> None:
    cfg = cfg_for("model=llama-7b", "precision=bf16", "cluster.gpus_per_node=8")
    for name in ("zero2_offload", "zero3_offload"):
        assert model_state_bytes(cfg, strategy(name))[1] > 100 * GIB


def test_fsdp_is_accounted_as_zero3_but_its_peak_and_states_are_its_own() -> None:
    """The engine accounting counts FSDP as ZeRO-3 (its host RAM); the predicted peak and
    the table's states follow FSDP's own moments (launcher/estimator/peak.py: fp32 shards,
    one unsharded layer, no max_live gather)."""
    cfg = cfg_for("model=llama-7b", "precision=bf16", "cluster.gpus_per_node=8",
                  "cluster.gpu=a100-80g")
    rows = {r.strategy: r for r in estimate(cfg).strategies}
    for fsdp, zero in (("fsdp", "zero3"), ("fsdp_offload", "zero3_offload")):
        assert model_state_bytes(cfg, strategy(fsdp)) == model_state_bytes(cfg, strategy(zero))
        assert rows[fsdp].moments != rows[zero].moments
        assert rows[fsdp].model_state_gpu_bytes == rows[fsdp].moments["optimizer_step"]


@pytest.mark.parametrize("model", ["gemma-3-12b", "mixtral-8x7b", "llama-3.1-8b"])
def test_the_states_column_never_exceeds_the_peak(model: str) -> None:
    """States are the device's model states in the optimizer step, a moment of the peak:
    gemma-3-12b's ZeRO-3 row said 29.39 GiB of states under a 25.64 GiB peak when it
    added the gathered embedding (1.0B parameters, live only in forward and backward),
    and a LoRA base in bf16 was counted in fp32 (the worker loads it in bf16)."""
    for extra in ([], ["peft=lora"], ["objective=dpo"], ["precision=fp32"]):
        cfg = cfg_for(f"model={model}", "cluster.gpu=h100-80g", "cluster.gpus_per_node=8",
                      "precision=bf16", *extra)
        for row in estimate(cfg).strategies:
            assert 0 <= row.model_state_gpu_bytes <= row.peak_bytes, (extra, row.strategy)
    zero3 = estimate(cfg_for(f"model={model}", "cluster.gpu=h100-80g",
                             "cluster.gpus_per_node=8", "precision=bf16")).row("zero3")
    assert zero3 is not None and zero3.model_state_gpu_bytes == zero3.moments["optimizer_step"]


# ------------------------------------------------------------------ compute


def test_flops_are_6pd_and_8pd_with_checkpointing() -> None:
    assert training_flops(7_000_000_000, 1_000_000) == 6 * 7e9 * 1e6
    assert training_flops(7_000_000_000, 1_000_000, gradient_checkpointing=True) == 8 * 7e15


def test_tokens_from_steps_and_time_from_peak_and_mfu() -> None:
    cfg = cfg_for(
        "model=llama-7b", "precision=bf16", "cluster.gpu=a100-80g", "cluster.gpus_per_node=8",
        "train.max_steps=100", "train.micro_batch_size=2", "train.grad_accum=4",
        "dataset.max_length=2048", "train.mfu=0.5",
    )
    tokens = 100 * (2 * 4 * 8) * 2048
    assert training_tokens(cfg) == tokens
    est = estimate(cfg)
    assert est.flops == 6 * count_params(cfg.model) * tokens
    assert est.est_seconds == pytest.approx(est.flops / (8 * 312e12 * 0.5))
    assert est.gpu_hours == pytest.approx(est.est_seconds * 8 / 3600)


def test_fp32_uses_the_fp32_peak() -> None:
    common = ["cluster.gpu=a100-80g", "dataset=alpaca"]
    fp32 = estimate(cfg_for("precision=fp32", *common)).est_seconds
    bf16 = estimate(cfg_for("precision=bf16", *common)).est_seconds
    preset = GPU_PRESETS["a100-80g"]
    assert fp32 / bf16 == pytest.approx(preset.peak_tflops_16bit / preset.peak_tflops_fp32)


def test_flops_per_token_is_mfus_numerator_without_recomputation() -> None:
    """The worker's MFU: 6P per token (4P with a frozen base), checkpointing left out."""
    base = ["model=llama-7b", "cluster.gpu=a100-80g"]
    psi = count_params(cfg_for(*base).model)
    assert flops_per_token(cfg_for(*base)) == 6 * psi
    assert flops_per_token(cfg_for(*base, "train.gradient_checkpointing=true")) == 6 * psi
    assert flops_per_token(cfg_for(*base, "peft=lora")) == 4 * psi
    ckpt = cfg_for(*base, "train.gradient_checkpointing=true")
    assert run_flops(ckpt, 1) == 8 * psi  # the time estimate pays for the recomputation


def test_peak_per_device_is_none_on_cpu() -> None:
    assert peak_flops_per_device(cfg_for("cluster.gpu=cpu")) is None
    a100 = ["cluster.gpu=a100-80g"]
    assert peak_flops_per_device(cfg_for(*a100, "precision=bf16")) == 312e12
    assert peak_flops_per_device(cfg_for(*a100, "precision=fp32")) == 19.5e12


def test_time_from_dataset_tokens_is_6pd_over_the_fp32_peak() -> None:
    """`ftl estimate` and `ftl report` (run_seconds of run_flops, for the tokens a run saw)
    both give 6PD / (world x peak x mfu): alpaca's 5M tokens on 2 A100s in fp32, mfu 0.4."""
    cfg = cfg_for("model=llama-7b", "cluster.gpu=a100-80g", "dataset=alpaca", "precision=fp32",
                  "cluster.gpus_per_node=2", "train.mfu=0.4")
    expected = 6 * 6_738_415_616 * 5_000_000 / (2 * 19.5e12 * 0.4)  # 12,959 s
    assert estimate(cfg).est_seconds == pytest.approx(expected)
    assert run_seconds(cfg, run_flops(cfg, 5_000_000)) == pytest.approx(expected)


def test_tokens_from_dataset_size_times_epochs() -> None:
    cfg = cfg_for("dataset=alpaca", "train.epochs=3")
    assert training_tokens(cfg) == 3 * 5_000_000


def test_unknown_tokens_say_so() -> None:
    cfg = cfg_for("dataset=arith")  # no num_tokens, max_steps=-1
    est = estimate(cfg)
    assert est.tokens is None and est.flops is None and est.est_seconds is None
    assert "token count is not known" in table_text(cfg)
    assert estimate(cfg, tokens=1000).flops == 6 * count_params(cfg.model) * 1000


# ------------------------------------------------------------------ activations


def test_checkpointing_shrinks_activations() -> None:
    base = ["model=llama-7b", "precision=bf16", "cluster.gpu=a100-80g", "dataset.max_length=4096"]
    full = activation_bytes(cfg_for(*base))
    ckpt = activation_bytes(cfg_for(*base, "train.gradient_checkpointing=true"))
    assert ckpt < full / 5


def test_activations_scale_with_micro_batch() -> None:
    one = activation_bytes(cfg_for("model=llama-7b", "cluster.gpu=a100-80g"))
    four = activation_bytes(cfg_for("model=llama-7b", "cluster.gpu=a100-80g",
                                    "train.micro_batch_size=4"))
    assert four == pytest.approx(4 * one)


# ------------------------------------------------------------------ PEFT


def test_lora_adapter_count_matches_peft() -> None:
    import peft
    import transformers
    cfg = cfg_for("model=tiny-llama", "peft=lora", "peft.r=8")
    m = cfg.model
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, num_key_value_heads=m.num_kv_heads,
        intermediate_size=m.intermediate_size, vocab_size=m.vocab_size,
    ))
    lora = peft.get_peft_model(model, peft.LoraConfig(
        r=8, target_modules=list(cfg.peft.target_modules), task_type="CAUSAL_LM"
    ))
    trainable, _ = lora.get_nb_trainable_parameters()
    assert adapter_params(cfg) == trainable


def test_lora_7b_r16_qkvo_is_16_8m() -> None:
    assert adapter_params(cfg_for("model=llama-7b", "peft=lora")) == 16_777_216


def test_peft_shrinks_model_states() -> None:
    full = ["model=llama-7b", "precision=bf16", "cluster.gpu=a100-40g", "cluster.gpus_per_node=1"]
    ddp = strategy("ddp")
    none = model_state_bytes(cfg_for(*full), ddp)[0]
    lora = model_state_bytes(cfg_for(*full, "peft=lora"), ddp)[0]
    qlora = model_state_bytes(cfg_for(*full, "peft=qlora"), ddp)[0]
    assert qlora < lora < none / 4
    # DDP keeps the base the worker loads (rank/model.model_dtype): bf16 when training in
    # bf16, else fp32 (fp16 AMP needs fp32 weights)
    assert 12.5 * GIB < lora < 13 * GIB
    fp16 = [*full[:1], "precision=fp16", *full[2:], "peft=lora"]
    assert 25 * GIB < model_state_bytes(cfg_for(*fp16), ddp)[0] < 26 * GIB
    assert 4 * GIB < qlora < 5 * GIB  # NF4 decoder weights, fp32 embeddings and lm_head
    zero2 = model_state_bytes(cfg_for(*full, "peft=lora"), strategy("zero2"))[0]
    assert 12.5 * GIB < zero2 < 13 * GIB  # DeepSpeed casts the base to bf16


# ------------------------------------------------------------------ outputs


def test_estimate_json_has_every_strategy() -> None:
    cfg = cfg_for("model=llama-7b", "cluster.gpus_per_node=8", "cluster.gpu=a100-80g",
                  "dataset=alpaca", "strategy=zero3")
    est = estimate(cfg)
    data = json.loads(json.dumps(estimate_json(est, chosen_strategy(cfg, est))))
    assert data["params"] == 6_738_415_616 and data["tokens"] == 5_000_000
    assert data["flops"] == pytest.approx(6 * 6_738_415_616 * 5_000_000)
    assert [s["strategy"] for s in data["strategies"]] == list(TABLE)
    keys = {"model_state_gpu_bytes", "activation_bytes", "peak_bytes", "steady_bytes",
            "moments", "construction_above_training", "gpu_bytes", "host_bytes", "fits",
            "est_seconds"}
    for row in data["strategies"]:
        assert keys <= row.keys()
        assert row["peak_bytes"] == max(row["moments"].values())
        assert row["gpu_bytes"] == row["peak_bytes"] + row["buffer_bytes"]
    assert data["chosen"] == "zero3"


def test_fits_leaves_headroom() -> None:
    cfg = cfg_for("model=llama-7b", "cluster.gpus_per_node=8", "cluster.gpu=a100-80g")
    for row in estimate(cfg).strategies:
        assert row.fits == (row.gpu_bytes <= 0.95 * 80 * GIB)


def test_host_memory_is_checked_when_known() -> None:
    base = ["model=llama-7b", "cluster.gpus_per_node=8", "cluster.gpu=a100-80g"]
    rows = {r.strategy: r for r in estimate(cfg_for(*base, "cluster.host_memory_gib=64"))
            .strategies}
    assert rows["zero3_offload"].fits_gpu and not rows["zero3_offload"].fits
    assert rows["zero3"].fits


def test_user_override_shows_in_the_configured_row() -> None:
    base = ["model=llama-7b", "cluster.gpus_per_node=8", "cluster.gpu=a100-80g",
            "strategy=zero3"]
    plain = {r.strategy: r for r in estimate(cfg_for(*base)).strategies}["zero3"]
    offl = {r.strategy: r for r in estimate(cfg_for(*base, "strategy.offload_optimizer=true"))
            .strategies}["zero3"]
    assert offl.model_state_gpu_bytes < plain.model_state_gpu_bytes


def test_table_names_model_cluster_precision_and_marks_choice() -> None:
    cfg = cfg_for("model=llama-7b", "cluster.gpus_per_node=8", "cluster.gpu=a100-80g",
                  "precision=bf16", "strategy=zero2")
    text = table_text(cfg)
    header = text.splitlines()[0]
    assert "llama-7b" in header and "6.74B" in header and "a100-80g" in header
    assert "bf16" in header
    marked = [line for line in text.splitlines() if line.startswith("* ")]
    assert marked[0].split()[1] == "zero2"
    for name in TABLE:
        assert any(line[2:].startswith(name + " ") for line in text.splitlines())


def test_row_finds_a_strategy_or_says_none() -> None:
    est = estimate(cfg_for("strategy=auto"))
    assert est.row("zero2") is est.strategies[list(TABLE).index("zero2")]
    assert est.row("auto") is None


def test_a_concrete_strategy_missing_from_the_table_gets_its_own_row() -> None:
    """e.g. a config.yaml read back from a run dir planned with another strategy table."""
    cfg = cfg_for("strategy=zero2")
    cfg.strategy.name = "zero2_old_site"
    est = estimate(cfg)
    assert [r.strategy for r in est.strategies] == [*TABLE, "zero2_old_site"]
    assert est.row("zero2_old_site").gpu_bytes == est.row("zero2").gpu_bytes


MODULES = [f"launcher.estimator.{m}" for m in ("estimate", "estimate_table", "flops", "memory",
                                                "auto")]


@pytest.mark.parametrize("module", MODULES)
def test_import_pulls_no_heavy_library(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "print(sorted(m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_estimate_does_not_import_auto() -> None:
    """auto reads an Estimate; the estimate (and its table) never ask auto back."""
    code = (
        "import sys, launcher.estimator.estimate, launcher.estimator.estimate_table, "
        "launcher.estimator.memory; "
        "print('launcher.estimator.auto' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ measured on a live engine

ENGINE_PROBE = r'''
import gc, json, sys
import deepspeed, torch
from transformers import LlamaConfig, LlamaForCausalLM

h, layers, heads, inter, vocab = map(int, sys.argv[1:6])
cases = [(int(stage), precision) for stage, precision in
         (case.split(":") for case in sys.argv[6].split(","))]
deepspeed.init_distributed(dist_backend="gloo")


def held_bytes():
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor):
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        except Exception:
            pass
    return sum(size for ptr, size in storages.items() if ptr)


def held_at_the_optimizer_step(stage, precision):
    # Tiny buckets and no persistent params: on a 164k-parameter model DeepSpeed's defaults
    # (5e8-element buckets, 1e5-element persistence threshold) would dwarf the model states.
    zero = {"stage": stage, "reduce_bucket_size": 4096, "allgather_bucket_size": 4096,
            "stage3_prefetch_bucket_size": 4096, "stage3_param_persistence_threshold": 0,
            "stage3_model_persistence_threshold": 0, "overlap_comm": False}
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "zero_optimization": zero, "zero_force_ds_cpu_optimizer": False,
          "bf16": {"enabled": precision == "bf16"}}
    config = LlamaConfig(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, intermediate_size=inter, vocab_size=vocab)
    with deepspeed.zero.Init(config_dict_or_path=ds, enabled=stage == 3):
        model = LlamaForCausalLM(config)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=ds)
    inner = engine.optimizer.optimizer
    torch_step, seen = inner.step, []

    def step(*args, **kwargs):  # states of the previous step + this step's fp32 grads
        seen.append(held_bytes())
        return torch_step(*args, **kwargs)

    inner.step = step
    ids = torch.randint(0, vocab, (1, 16))
    for _ in range(2):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    engine.destroy()
    return seen[-1]


# One process group for every case (the imports and the group cost more than an engine).
# What an earlier case leaves alive is measured before each and taken off its count.
for stage, precision in cases:
    before = held_bytes()
    held = held_at_the_optimizer_step(stage, precision) - before
    if torch.distributed.get_rank() == 0:
        print("HELD", json.dumps([stage, precision, held, before]), flush=True)
    torch.distributed.barrier()
torch.distributed.destroy_process_group()
'''

# ZeRO-3 last: it is the one that patches module construction (zero.Init).
LIVE_CASES = [(1, "fp32"), (2, "fp32"), (2, "bf16"), (3, "fp32")]


@pytest.fixture(scope="module")
def live_engine_held(tmp_path_factory) -> dict[tuple[int, str], int]:
    # Every live tensor of rank 0 summed as the optimizer step starts, 2 CPU ranks (gloo),
    # one torchrun for all cases.
    import os

    m = cfg_for("model=tiny-llama").model
    probe = tmp_path_factory.mktemp("engine-probe") / "probe.py"
    probe.write_text(ENGINE_PROBE)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2", str(probe), str(m.hidden_size), str(m.num_layers), str(m.num_heads),
            str(m.intermediate_size), str(m.vocab_size),
            ",".join(f"{stage}:{precision}" for stage, precision in LIVE_CASES)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    use_own_build_cache(env)  # DeepSpeed's ops where a rank finds them (`make ops`)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    held = {}
    for line in out.stdout.splitlines():
        if line.startswith("HELD "):
            stage, precision, nbytes, _ = json.loads(line.split(" ", 1)[1])
            held[(stage, precision)] = nbytes
    assert len(held) == len(LIVE_CASES), out.stdout[-2000:] + out.stderr[-4000:]
    return held


# `make test-full` only (a torchrun of DeepSpeed engines, ~15 s on 2 cores): `make test`
# keeps its twin, test_engine_accounting_matches_measured_engine (the same bytes, measured
# once and pinned), and the live ZeRO-2 memory run of tests/integration/test_memory_peak.py.
@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("stage, precision", LIVE_CASES)
def test_engine_accounting_equals_what_a_live_engine_holds(
    live_engine_held, stage: int, precision: str
) -> None:
    m = cfg_for("model=tiny-llama").model
    psi = count_params(m)
    parts = engine_model_state_parts(
        psi, largest_layer_params(m), 2, stage, param_bytes=4 if precision == "fp32" else 2
    )
    predicted = parts["params"] + parts["grads"] + parts["optimizer"]
    assert live_engine_held[(stage, precision)] == pytest.approx(predicted, rel=0.02)


def test_tensor_parallel_splits_the_layers_not_the_embeddings() -> None:
    base = ["model=llama-7b", "cluster.gpu=a100-80g", "cluster.gpus_per_node=8",
            "strategy=zero1", "precision=bf16"]
    model = cfg_for(*base).model
    linears = model.num_layers * layer_linear_params(model)
    assert rank_params(model, 1) == count_params(model)
    assert rank_params(model, 2) == count_params(model) - linears // 2
    one, two = (estimate(cfg_for(*base, f"parallel.tp={tp}")).row("zero1") for tp in (1, 2))
    assert two.activation_bytes < one.activation_bytes
    assert two.model_state_gpu_bytes < one.model_state_gpu_bytes
    assert two.peak_bytes < one.peak_bytes


def test_sequence_parallel_splits_the_activations_not_the_sharding() -> None:
    """Ulysses: each rank runs max_length / sp tokens of every layer (plus the head-split
    q, k, v and attention output), while ZeRO-3 still shards the model states over every
    rank."""
    base = ["model=llama-7b", "cluster.gpu=a100-80g", "cluster.gpus_per_node=8",
            "strategy=zero3", "precision=bf16", "dataset.max_length=4096",
            "train.micro_batch_size=1"]
    one, four = (cfg_for(*base, f"parallel.sp={sp}") for sp in (1, 4))
    assert (one.dp_size, four.dp_size) == (8, 2)
    assert one.shard_size == four.shard_size == 8
    rows = [estimate(cfg).row("zero3") for cfg in (one, four)]
    assert rows[1].model_state_gpu_bytes == rows[0].model_state_gpu_bytes
    h, kv = one.model.hidden_size, one.model.hidden_size  # 32 KV heads: kv width h
    per_token = layer_activation_elements(one.model)
    assert layer_activation_elements(one.model, sp=4) == per_token + 2 * h + 2 * kv
    assert rows[1].activation_bytes == pytest.approx(
        rows[0].activation_bytes * (per_token + 4 * h) / per_token / 4, rel=0.02)
    assert rows[1].peak_bytes < rows[0].peak_bytes


def test_inference_fit_counts_weights_kv_cache_and_logits() -> None:
    """The estimate's inference line (ftl eval/chat, one process): llama-7b in bf16 with a
    batch of 16 x 2048 tokens, by hand: 2 bytes per weight; K and V of 32 layers x 32 heads
    x 128 dims per token; the harness's loglikelihood logits and their log-softmax, 4 bytes
    per element at 16 bits (memory.INFERENCE_LOGITS_BYTES_PER_ELEMENT, measured on CPU);
    1.5 GiB allowance. llama-70b needs --shard
    over two A100s; with one GPU per node it fits nowhere and says the fix."""
    seven = ["model=llama-7b", "precision=bf16", "cluster.gpu=a100-80g",
             "cluster.gpus_per_node=8", "dataset.max_length=2048", "eval.batch_size=16"]
    cfg = compose_config(seven)
    est = estimate(cfg)
    tokens = 16 * 2048
    inf = est.inference
    assert inf.weight_bytes == 6_738_415_616 * 2
    assert inf.batch_bytes == 2 * 32 * 32 * 128 * tokens * 2 + tokens * 32000 * 4
    assert inf.total_bytes == inf.weight_bytes + inf.batch_bytes + 1.5 * 2**30
    assert inf.fits and inf.shard_devices == 1
    assert "= 33.96 GiB: fits one a100-80g" in render_estimate_table(cfg, est, None)
    big = compose_config([*seven, "model=llama-70b", "dataset.max_length=512"])
    assert not estimate(big).inference.fits
    assert "ftl eval --shard spreads it over 2 of the node's 8" in table_text(big)
    alone = compose_config([*seven, "model=llama-70b", "cluster.gpus_per_node=1"])
    assert estimate(alone).inference.shard_devices == 0
    assert "nor the node's 1 with --shard. Fix: a smaller eval.batch_size" in table_text(alone)
