"""What a run optimizes (`objective=NAME`, configs/objective/): the names the validation
stage, the estimator and the ranks share, without importing TRL."""

from __future__ import annotations

from launcher.config.schema import RunConfig

SFT = "sft"
DPO = "dpo"
OBJECTIVES = (SFT, DPO)

DPO_LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard",
    "aot", "aot_unpaired", "apo_zero", "apo_down", "discopop", "sigmoid_norm",
)
"""TRL 1.16 DPOConfig's pair losses (its `sft` is objective.sft_weight here); TRL accepts
a bad name until the first step, so validation checks it against this list
(tests/unit/test_objective.py keeps the list equal to TRL's)."""

EXPERIMENTAL_LOSSES = {
    "simpo": "trl.experimental.cpo (CPOTrainer, loss_type=simpo)",
    "orpo": "trl.experimental.orpo (ORPOTrainer)",
    "cpo": "trl.experimental.cpo (CPOTrainer)",
    "kto": "trl's KTOTrainer, which reads unpaired data (prompt, completion, label)",
}
"""Preference losses TRL has outside DPOTrainer: not run by ftl (its note says why)."""


def is_dpo(cfg: RunConfig) -> bool:
    return cfg.objective.name == DPO


def sequences_per_row(cfg: RunConfig) -> int:
    """Sequences one batch row runs through the model: 2 under objective=dpo (prompt +
    chosen, prompt + rejected, each up to dataset.max_length), else 1."""
    return 2 if is_dpo(cfg) else 1


def has_reference_model(cfg: RunConfig) -> bool:
    """A DPO run whose reference is a model of its own: a full fine-tune's. LoRA/QLoRA:
    the base with its adapters disabled is the reference."""
    return is_dpo(cfg) and cfg.peft.name == "none"


def holds_reference(cfg: RunConfig) -> bool:
    """A DPO run whose ranks keep that second, frozen model through training: without
    precomputed reference log-probabilities."""
    return has_reference_model(cfg) and not cfg.objective.precompute_ref_log_probs
