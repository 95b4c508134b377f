"""strategy=auto: the fastest strategy that fits, the reasons, and a refusal that helps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.config.compose import compose_config, load_run_config
from launcher.config.schema import RunConfig
from launcher.config.strategies import CHOSEN_FIELDS, strategy_table
from launcher.errors import ConfigError
from launcher.estimator.auto import (
    auto_ladder,
    candidates,
    choose,
    chosen_strategy,
    faster_elsewhere,
    model_parallel_layout,
    nothing_fits,
    resolve,
)
from launcher.estimator.estimate import estimate
from launcher.run.submit import submit
from launcher.rundir import CONFIG
from launcher.validation.validate import validate

OFFLOAD = {"zero2_offload", "zero3_offload", "fsdp_offload"}
DEEPSPEED_LADDER = auto_ladder("deepspeed")


def auto_cfg(*overrides: str) -> RunConfig:
    return compose_config(["strategy=auto", *overrides])


def choose_or_refuse(cfg: RunConfig) -> tuple[str, list[str]]:
    """What the planner does: one estimate, choose from it, refuse with the fixes."""
    name, reasons = choose(cfg, estimate(cfg))
    if name is None:
        raise ConfigError(nothing_fits(cfg, reasons))
    return name, reasons


def test_7b_on_8_a100_80g_picks_a_non_offload_strategy() -> None:
    cfg = auto_cfg("model=llama-7b", "precision=bf16", "cluster.gpu=a100-80g",
                   "cluster.gpus_per_node=8", "dataset.max_length=2048")
    name, reasons = choose(cfg, estimate(cfg))
    assert name not in OFFLOAD
    assert name == "zero1"  # ddp needs 20 bytes/param = 125 GiB
    assert reasons[0].startswith("ddp needs ") and "a100-80g has 80" in reasons[0]
    assert reasons[-1].startswith("zero1 fits")


def test_70b_on_8_a100_40g_offloads_or_refuses() -> None:
    cfg = auto_cfg("model=llama-70b", "precision=bf16", "cluster.gpu=a100-40g",
                   "cluster.gpus_per_node=8", "dataset.max_length=2048")
    try:
        name, reasons = choose_or_refuse(cfg)
    except ConfigError as error:
        assert "peft=lora" in str(error)
    else:
        assert name in OFFLOAD
        assert len(reasons) == DEEPSPEED_LADDER.index(name) + 1


def test_choice_is_the_first_fitting_row_in_order() -> None:
    cfg = auto_cfg("model=llama-13b", "precision=bf16", "cluster.gpu=a100-40g",
                   "cluster.gpus_per_node=8")
    est = estimate(cfg)
    name, _ = choose(cfg, est)
    assert name is not None
    index = DEEPSPEED_LADDER.index(name)
    assert est.row(name).fits
    assert not any(est.row(n).fits for n in DEEPSPEED_LADDER[:index])


def test_choose_reads_the_estimate_it_is_given() -> None:
    """No estimate inside choose: a row marked as not fitting is passed over."""
    cfg = auto_cfg()
    est = estimate(cfg)
    assert choose(cfg, est)[0] == "ddp"
    est.row("ddp").fits = est.row("ddp").fits_gpu = False
    name, reasons = choose(cfg, est)
    assert name == DEEPSPEED_LADDER[1] and reasons[0].startswith("ddp needs")


def test_nothing_fits_refuses_with_fixes() -> None:
    cfg = auto_cfg("model=llama-70b", "precision=bf16", "cluster.gpu=a100-40g",
                   "cluster.gpus_per_node=1", "cluster.host_memory_gib=256",
                   "dataset.max_length=4096", "train.micro_batch_size=4")
    name, reasons = choose(cfg, estimate(cfg))
    assert name is None and len(reasons) == len(DEEPSPEED_LADDER)
    problems = nothing_fits(cfg, reasons)
    text = "\n".join(problems)
    for fix in ("peft=qlora", "cluster.nodes=2", "dataset.max_length=2048",
                "train.gradient_checkpointing=true", "train.micro_batch_size=1"):
        assert fix in text, fix
    assert "cluster.host_memory_gib is 256" in text  # offload also rejected for host RAM
    assert len(problems) == len(DEEPSPEED_LADDER) + 2


def test_lora_suggestion_is_checked_not_guessed() -> None:
    cfg = auto_cfg("model=llama-7b", "precision=bf16", "cluster.gpu=a100-40g",
                   "cluster.gpus_per_node=1", "cluster.host_memory_gib=64")
    with pytest.raises(ConfigError, match=r"peft=lora \(fits with ddp\)"):
        choose_or_refuse(cfg)


def test_fsdp_only_when_asked() -> None:
    base = ["model=llama-13b", "precision=bf16", "cluster.gpu=a100-80g",
            "cluster.gpus_per_node=8"]
    plain, _ = choose_or_refuse(auto_cfg(*base))
    asked, reasons = choose_or_refuse(auto_cfg(*base, "strategy.backend=fsdp"))
    assert not plain.startswith("fsdp")
    assert asked == "fsdp" and reasons[0].startswith("ddp needs")


def test_a_faster_rung_of_the_other_engine_that_fits_is_named() -> None:
    """Qwen3-30B-A3B on 8 H100s: ZeRO-3 needs 77.6 GiB of 76 usable, FSDP 65.3, so auto's
    DeepSpeed ladder ends at zero3_offload; what to type for FSDP is said, not chosen."""
    base = ["model=qwen3-30b-a3b", "cluster.gpu=h100-80g", "cluster.gpus_per_node=8"]
    checked = validate(auto_cfg(*base), "plan")
    assert checked.cfg.strategy.name == "zero3_offload"
    hint = checked.strategy_reasons[-1]
    assert hint.startswith("fsdp also fits and is faster than zero3_offload (65.3 GiB per GPU)")
    assert hint.endswith("To use it: strategy=fsdp")
    assert hint == faster_elsewhere(auto_cfg(*base), checked.estimate, "zero3_offload")
    # Climbing FSDP's rungs, or a pick the other engine's rungs do not beat: no line.
    asked = validate(auto_cfg(*base, "strategy.backend=fsdp"), "plan")
    assert asked.cfg.strategy.name == "fsdp" and "also fits" not in asked.strategy_reasons[-1]
    zero3 = validate(auto_cfg("model=qwen3-32b", "precision=bf16", "cluster.gpu=h100-80g",
                              "cluster.gpus_per_node=8"), "plan")  # fsdp fits: the same rung
    assert zero3.cfg.strategy.name == "zero3"
    assert not any("also fits" in reason for reason in zero3.strategy_reasons)


def test_resolve_takes_the_table_entry_and_keeps_user_tweaks() -> None:
    cfg = auto_cfg("model=llama-70b", "precision=bf16", "cluster.gpu=a100-80g",
                   "cluster.gpus_per_node=8", "cluster.nodes=2", "strategy.overlap_comm=false")
    name, _ = choose(cfg, estimate(cfg))
    resolved = resolve(cfg, name)
    assert resolved.strategy.name == name == "zero3"
    assert resolved.strategy.backend == "deepspeed" and resolved.strategy.zero_stage == 3
    assert resolved.strategy.auto_rank == strategy_table()["zero3"].auto_rank
    assert resolved.strategy.overlap_comm is False
    assert cfg.strategy.name == "auto"  # the input is left alone
    assert strategy_table()["zero3"].overlap_comm is True  # and so is the cached table


def test_resolved_row_is_the_auto_estimates_row() -> None:
    """One estimate per plan: the chosen row of the auto config equals the resolved run's."""
    cfg = auto_cfg("model=llama-7b", "precision=bf16", "cluster.gpu=a100-80g",
                   "cluster.gpus_per_node=8", "strategy.bucket_size=1000")
    est = estimate(cfg)
    name, _ = choose(cfg, est)
    resolved = resolve(cfg, name)
    assert estimate(resolved).row(name) == est.row(name)


def test_chosen_fields_are_strategy_fields() -> None:
    assert set(CHOSEN_FIELDS) <= set(vars(strategy_table()["zero1"]))


def test_resolve_leaves_a_named_strategy_alone() -> None:
    cfg = compose_config(["strategy=zero2"])
    assert resolve(cfg, "zero3") == cfg
    assert chosen_strategy(cfg, estimate(cfg)) == "zero2"


def test_tiny_model_on_cpu_picks_ddp() -> None:
    name, reasons = choose(auto_cfg(), estimate(auto_cfg()))
    assert name == "ddp" and len(reasons) == 1


def test_with_tensor_parallelism_auto_climbs_only_the_rungs_that_split() -> None:
    cfg = auto_cfg("model=llama-7b", "cluster.gpu=a100-80g", "cluster.gpus_per_node=8",
                   "parallel.tp=2")
    assert candidates(cfg) == ("zero1", "zero2", "zero3")
    name, _ = choose(cfg, estimate(cfg))
    assert name in candidates(cfg)
    assert [row.strategy for row in estimate(cfg).strategies] == ["zero1", "zero2", "zero3"]


LONG = ("model=llama-7b", "cluster.gpu=a100-80g", "cluster.gpus_per_node=8",
        "precision=bf16", "dataset.max_length=32768", "model.max_position_embeddings=32768",
        "train.micro_batch_size=1")
"""32k tokens of llama-7b on 8 A100-80GB: every plain strategy needs ~180 GiB of activations
per GPU without activation checkpointing."""


def test_a_long_sequence_nothing_fits_gets_the_smallest_model_parallel_layout() -> None:
    """LONG with checkpointing kept off as typed: Ulysses over 4 ranks brings zero3 under
    the limit, sp=2 does not."""
    cfg = auto_cfg(*LONG, "train.gradient_checkpointing=false")
    assert choose(cfg, estimate(cfg))[0] is None
    layout = model_parallel_layout(cfg)
    assert layout is not None
    chosen, est, reasons = layout
    assert (chosen.strategy.name, chosen.parallel.sp, chosen.dp_size) == ("zero3", 4, 2)
    assert est.row("zero3").fits and [r.strategy for r in est.strategies] == ["zero3"]
    assert len(reasons) == 1 and "with parallel.sp=4" in reasons[0]
    checked = validate(cfg, "plan")
    assert (checked.cfg.strategy.name, checked.cfg.parallel.sp) == ("zero3", 4)
    packed = auto_cfg("model=llama-7b", "cluster.gpu=a100-80g", "cluster.gpus_per_node=8",
                      "precision=bf16", "dataset.max_length=32768", "dataset.packing=true",
                      "model.max_position_embeddings=32768", "train.micro_batch_size=1")
    packed_layout = model_parallel_layout(packed)  # Ulysses would mix packed documents
    assert packed_layout is not None
    assert (packed_layout[0].parallel.sp, packed_layout[0].parallel.tp) == (1, 8)
    assert "with parallel.tp=8" in packed_layout[2][0]


def test_checkpointing_comes_before_offload_and_model_parallelism(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mixtral-8x7B on 2 x 8 H100s at 4096 tokens: ZeRO-3 needs 88.8 GiB of 76 usable, 50.5
    with activation checkpointing, so auto turns it on rather than climb to zero3_offload
    (whose optimizer step runs on the host's CPUs), and says so with what to type to keep
    it off; typed, checkpointing stays off. LONG likewise fits zero1 with checkpointing."""
    base = ["model=mixtral-8x7b", "cluster.gpu=h100-80g", "cluster.gpus_per_node=8",
            "cluster.nodes=2", "precision=bf16", "dataset.max_length=4096"]
    checked = validate(auto_cfg(*base), "plan")
    assert checked.cfg.strategy.name == "zero3" and checked.cfg.train.gradient_checkpointing
    assert checked.estimate.row("zero3").fits  # the estimate of the run as it will train
    reasons = checked.strategy_reasons
    assert reasons[3].startswith("zero3 needs 88.8 GiB")
    assert reasons[-2] == ("with train.gradient_checkpointing=true: zero3 fits: 50.5 GiB per "
                           "GPU of 80 on h100-80g")
    assert reasons[-1].startswith("auto turns on train.gradient_checkpointing=true: zero3 "
                                  "needs 50.5 GiB per GPU with it, 88.8 without")
    assert reasons[-1].endswith("To keep it off: strategy=zero3_offload.")
    # ftl estimate marks the pick and says what it turns on (the rows: as configured).
    assert main(["estimate", "--json", "strategy=auto", *base]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"] == "zero3" and data["chosen_with_checkpointing"]
    assert main(["estimate", "strategy=auto", *base]) == 0
    table = capsys.readouterr().out
    assert "* strategy=auto picks zero3" in table and reasons[-1] in table
    # The job gets it (the run dir's config), and ftl submit says so in one line.
    assert submit(["cluster=slurm", "strategy=auto", *base, f"run.output_dir={tmp_path}"],
                  dry_run=True) == 0
    assert ("ftl: strategy=auto picked zero3 with train.gradient_checkpointing=true (why: "
            in capsys.readouterr().err)
    (run_dir,) = tmp_path.glob("*/*")
    assert load_run_config(run_dir / CONFIG).train.gradient_checkpointing
    typed = validate(auto_cfg(*base, "train.gradient_checkpointing=false"), "plan")
    assert typed.cfg.strategy.name == "zero3_offload"
    assert not typed.cfg.train.gradient_checkpointing
    assert not any("checkpointing" in reason for reason in typed.strategy_reasons)
    kept = validate(auto_cfg(*base, "strategy.auto_checkpointing=false"), "plan")
    assert kept.cfg.strategy.name == "zero3_offload"
    # A rung of the other engine that fits without checkpointing is named: Qwen3-30B-A3B
    # at 2048 tokens on 8 H100s, ZeRO-3 79.2 GiB (63.9 with checkpointing), FSDP 65.4.
    qwen = validate(auto_cfg("model=qwen3-30b-a3b", "cluster.gpu=h100-80g",
                             "cluster.gpus_per_node=8", "precision=bf16",
                             "dataset.max_length=2048"), "plan")
    assert qwen.cfg.strategy.name == "zero3" and qwen.cfg.train.gradient_checkpointing
    assert qwen.strategy_reasons[-1].startswith(
        "fsdp fits without checkpointing (65.4 GiB per GPU), faster than zero3 with it;")
    # A refusal's fixes are tried as auto would climb after them: checkpointing included.
    with pytest.raises(ConfigError, match=r"cluster\.nodes=2 \(fits with zero3 and "
                       r"train\.gradient_checkpointing=true\)"):
        validate(auto_cfg("model=mixtral-8x7b", "cluster.gpu=a100-80g", "precision=bf16",
                          "cluster.gpus_per_node=8", "cluster.host_memory_gib=256",
                          "dataset.max_length=4096"), "plan")
    # A run that fits as configured is left alone; so is one that checkpoints already.
    plain = validate(auto_cfg("model=llama-7b", "precision=bf16", "cluster.gpu=a100-80g",
                              "cluster.gpus_per_node=8", "dataset.max_length=2048"), "plan")
    assert plain.cfg.strategy.name == "zero1" and not plain.cfg.train.gradient_checkpointing
    long = validate(auto_cfg(*LONG), "plan")
    assert (long.cfg.strategy.name, long.cfg.parallel.sp) == ("zero1", 1)
    assert long.cfg.train.gradient_checkpointing
    # llama-70b on 8 A100-40GB: no rung fits without checkpointing, offloaded or not.
    offloaded = validate(auto_cfg("model=llama-70b", "precision=bf16", "cluster.gpu=a100-40g",
                                  "cluster.gpus_per_node=8", "dataset.max_length=2048"), "plan")
    assert offloaded.cfg.strategy.name == "zero3_offload"
    assert offloaded.strategy_reasons[-1].endswith("without; nothing fits without it.")


def test_a_4bit_base_climbs_only_the_rungs_that_take_it() -> None:
    """peft=qlora: no ZeRO-3 or FSDP rung (its base is not sharded here), so auto never
    picks a strategy validation then refuses. Mixtral-8x7B's experts stay unquantized (3-D
    weights), so on 8 H100s nothing takes it, and the fixes name LoRA on ZeRO-3; a dense
    70B in 4-bit fits one H100 with checkpointing."""
    base = ["model=mixtral-8x7b", "cluster.gpu=h100-80g", "cluster.gpus_per_node=8",
            "precision=bf16", "dataset.max_length=2048", "peft=qlora", "model.path=/m"]
    cfg = auto_cfg(*base)
    assert candidates(cfg) == ("ddp", "zero1", "zero2", "zero2_offload")
    with pytest.raises(ConfigError) as refused:
        validate(cfg, "plan")
    text = str(refused.value)
    assert "zero3" not in text.split("Fix:")[0] and "peft=lora (fits with zero3)" in text
    dense = validate(auto_cfg("model=llama-3.1-70b", "cluster.gpu=h100-80g",
                              "cluster.gpus_per_node=1", "precision=bf16", "peft=qlora",
                              "model.path=/m", "dataset.max_length=2048"), "plan")
    assert dense.cfg.strategy.name == "ddp" and dense.cfg.train.gradient_checkpointing
