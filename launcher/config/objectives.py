"""What a run optimizes (`objective=NAME`, configs/objective/): the names the validation
stage, the estimator and the ranks share, without importing TRL."""

from __future__ import annotations

from launcher.config.schema import RunConfig

SFT = "sft"
DPO = "dpo"
OBJECTIVES = (SFT, DPO)

PREFERENCE_FORMAT = "preference"
"""The dataset.format a DPO run reads, and only a DPO run."""

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


def holds_reference(cfg: RunConfig) -> bool:
    """A DPO run whose ranks keep a second, frozen model through training: a full
    fine-tune without precomputed reference log-probabilities. LoRA/QLoRA: the base with
    its adapters disabled is the reference."""
    return (is_dpo(cfg) and cfg.peft.name == "none"
            and not cfg.objective.precompute_ref_log_probs)
