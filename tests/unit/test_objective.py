"""objective=dpo before launch (its rules, TRL's loss list) and on a rank (the trainer ftl
builds computes TRL's own losses, and never moves the reference), one process, no ranks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher.config.compose import compose_config
from launcher.config.objectives import DPO_LOSS_TYPES, holds_reference
from launcher.errors import ConfigError
from launcher.rank.objective import dpo_trainer_class, objective_kwargs
from launcher.validation.validate import validate

ROOT = Path(__file__).resolve().parents[2]


def problems_for(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate(compose_config(overrides), "plan")
    return caught.value.problems


def test_objective_dpo_alone_picks_the_demo_pairs_and_plans() -> None:
    cfg = compose_config(["objective=dpo"])
    assert (cfg.objective.name, cfg.dataset.name, cfg.dataset.format) == (
        "dpo", "prefs", "preference")
    validate(cfg, "plan")
    typed = compose_config(["objective=dpo", "dataset=chat"])  # what the user typed wins
    assert typed.dataset.name == "chat"


def test_bad_dpo_settings_are_refused_together_naming_each_key() -> None:
    problems = problems_for(["objective=dpo", "dataset=arith", "objective.beta=0",
                             "objective.loss_type=simpo", "objective.label_smoothing=0.5",
                             "objective.sft_weight=-1", "strategy=zero3", "parallel.sp=2"])
    joined = "\n".join(problems)
    for key in ("dataset.format=alpaca", "objective.beta=0", "objective.loss_type=simpo",
                "objective.label_smoothing=0.5", "objective.sft_weight=-1.0",
                "parallel.sp=2"):
        assert key in joined, (key, problems)
    assert "trl.experimental.cpo" in joined and "Fix:" in joined
    assert any("preference pairs train objective=dpo" in p
               for p in problems_for(["dataset=prefs"]))  # sft on pairs
    assert "exo_pair needs" in "\n".join(problems_for(
        ["objective=dpo", "objective.loss_type=exo_pair"]))


def test_the_loss_list_is_trls_own() -> None:
    from trl import DPOConfig

    help_text = DPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    trl_losses = set(re.findall(r"`'(\w+)'`", help_text)) - {"sft"}
    assert trl_losses == set(DPO_LOSS_TYPES)


def test_sft_weight_adds_trls_sft_term_and_the_reference_rule() -> None:
    cfg = compose_config(["objective=dpo", "objective.sft_weight=0.5"])
    kwargs = objective_kwargs(cfg)
    assert kwargs["loss_type"] == ["sigmoid", "sft"] and kwargs["loss_weights"] == [1.0, 0.5]
    assert holds_reference(cfg)
    assert not holds_reference(compose_config(["objective=dpo", "peft=lora"]))
    assert not holds_reference(compose_config(
        ["objective=dpo", "objective.precompute_ref_log_probs=true"]))


def test_ftls_trainer_computes_trls_losses_and_leaves_the_reference_alone(
    tmp_path: Path,
) -> None:
    """TRL's DPOTrainer tokenizing the raw pairs itself, and ftl's on those tokens given
    pre-tokenized: the same per-step losses; the reference's weights never change."""
    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "assets/tokenizer")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    lines = (ROOT / "data/prefs/train.jsonl").read_text().splitlines()[:32]
    rows = [json.loads(line) for line in lines]

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        config = AutoConfig.for_model(
            "llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, intermediate_size=128, vocab_size=len(tokenizer),
            max_position_embeddings=128)
        return AutoModelForCausalLM.from_config(config)

    def args(name: str) -> DPOConfig:
        return DPOConfig(output_dir=str(tmp_path / name), use_cpu=True, bf16=False,
                         report_to=[], max_steps=4, per_device_train_batch_size=4,
                         logging_steps=1, learning_rate=1e-3, activation_checkpointing=False,
                         save_strategy="no", disable_tqdm=True)

    trl_trainer = DPOTrainer(model(), ref_model=model(), args=args("trl"),
                             train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    tokens = trl_trainer.train_dataset.select_columns(["prompt_ids", "chosen_ids", "rejected_ids"])
    trl_trainer.train()
    reference = model()
    initial = [p.detach().clone() for p in reference.parameters()]
    ftl_trainer = dpo_trainer_class()(model(), ref_model=reference, args=args("ftl"),
                                      train_dataset=tokens, processing_class=tokenizer)
    ftl_trainer.train()

    def losses(trainer: DPOTrainer) -> list[float]:
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    assert losses(ftl_trainer) == losses(trl_trainer)
    assert losses(ftl_trainer)[-1] < losses(ftl_trainer)[0]
    assert all(torch.equal(a, b) for a, b in zip(initial, reference.parameters(), strict=True))
    assert "rewards/accuracies" in ftl_trainer.state.log_history[0]
