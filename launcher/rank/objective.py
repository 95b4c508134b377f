"""What the ranks optimize: the Trainer and its arguments per `objective` (sft: the HF
Trainer the engine names; dpo: TRL's DPOTrainer), and a DPO run's reference model.

DPO reads the pairs ftl tokenized before launch (launcher/data: prompt_ids, chosen_ids,
rejected_ids, TRL's own column names), so TRL's tokenization is skipped, and TRL's
DataCollatorForPreference batches them (chosen and rejected in one batch of twice the
micro batch). The reference, by strategy (docs/guide.md, "Preference tuning"): LoRA/QLoRA
none (TRL disables the adapters); full fine-tunes the initial weights built again like
the policy, which TRL shards under ZeRO-3 and FSDP and keeps whole under DDP and ZeRO-1/2;
with precompute_ref_log_probs only its log-probabilities, computed before the first step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launcher.config.objectives import has_reference_model, holds_reference, is_dpo
from launcher.config.schema import RunConfig
from launcher.data.encode import PAIR_COLUMNS
from launcher.engines.base import Engine


def arguments_class(cfg: RunConfig) -> type | None:
    """The TrainingArguments subclass of the objective; None: TrainingArguments."""
    if not is_dpo(cfg):
        return None
    from trl import DPOConfig

    return DPOConfig


def objective_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """The objective's own arguments (DPOConfig's)."""
    if not is_dpo(cfg):
        return {}
    o = cfg.objective
    losses, weights = [o.loss_type], None
    if o.sft_weight > 0:
        losses, weights = [o.loss_type, "sft"], [1.0, o.sft_weight]
    return dict(
        beta=o.beta, loss_type=losses, loss_weights=weights, label_smoothing=o.label_smoothing,
        precompute_ref_log_probs=o.precompute_ref_log_probs,
        max_length=cfg.dataset.max_length,  # the data side already fits each pair in it
    )


def needs_reference_model(cfg: RunConfig, args: Any) -> bool:
    """Whether this rank must build a reference model for TRL: a full fine-tune's frozen
    copy, and under FSDP also for precomputing (TRL would load one from the policy's
    name_or_path, which a model built from config lacks; the policy is not filled on
    every rank until it is sharded)."""
    return has_reference_model(cfg) and (holds_reference(cfg) or bool(args.fsdp))


def reference_model(cfg: RunConfig, engine: Engine, tokenizer: Any, args: Any) -> Any | None:
    """The initial weights again, frozen; None when TRL needs no second model."""
    if not needs_reference_model(cfg, args):
        return None
    from launcher.rank.model import build_model

    # Whole on every rank (not filled from rank 0): TRL shards it itself (FSDP's
    # fully_shard keeps each rank's slice of what that rank holds).
    reference = build_model(cfg, engine, tokenizer, whole=True)
    reference.requires_grad_(False)
    return reference.eval()


def trainer_parts(cfg: RunConfig, engine: Engine, reference: Any,
                  sft_collator: Callable[[], Any]) -> tuple[type, dict[str, Any]]:
    """The Trainer class and the keywords that differ per objective."""
    if not is_dpo(cfg):
        return engine.trainer_class(cfg), {"data_collator": sft_collator()}
    # data_collator None: TRL's DataCollatorForPreference, padding each batch itself.
    return dpo_trainer_class(), {"ref_model": reference, "data_collator": None}


def dpo_trainer_class() -> type:
    from trl import DPOTrainer

    class PretokenizedDPOTrainer(DPOTrainer):
        """TRL's DPOTrainer on pairs ftl tokenized before launch (PAIR_COLUMNS):
        its own tokenization of prompt/chosen/rejected text is skipped."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if self.args.precompute_ref_log_probs and self.ref_model is not None:
                self.ref_model = None  # its log-probabilities are computed: free it

        def _prepare_dataset(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
            if set(PAIR_COLUMNS) <= set(dataset.column_names):
                return dataset
            return super()._prepare_dataset(dataset, *args, **kwargs)

    return PretokenizedDPOTrainer
