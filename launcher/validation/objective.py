"""Rules of `objective.*`: what a DPO run needs of its data, its keys and its layout (the
one stage: launcher/validation/validate.py)."""

from __future__ import annotations

from launcher.config.objectives import (
    DPO_LOSS_TYPES,
    EXPERIMENTAL_LOSSES,
    is_dpo,
)
from launcher.config.schema import RunConfig
from launcher.data.formats import PREFERENCE
from launcher.errors import flagged


def objective_problems(cfg: RunConfig) -> list[str]:
    fmt = cfg.dataset.format
    if not is_dpo(cfg):
        return flagged([(
            fmt == PREFERENCE,
            f"dataset.format={fmt}: preference pairs train objective=dpo, not "
            f"objective={cfg.objective.name}. Fix: objective=dpo, or data in another "
            "dataset.format.")])
    o = cfg.objective
    return flagged([
        (fmt != PREFERENCE,
         f"dataset.format={fmt} with objective=dpo: DPO trains on preference pairs. Fix: "
         f"dataset.format={PREFERENCE} (rows of prompt, chosen, rejected: "
         "docs/guide.md, \"Preference tuning\"), or dataset=prefs for the demo pairs."),
        (o.beta <= 0,
         f"objective.beta={o.beta}: must be greater than 0 (how far the policy may move "
         "from the reference). Fix: e.g. objective.beta=0.1."),
        (not 0 <= o.label_smoothing < 0.5,
         f"objective.label_smoothing={o.label_smoothing}: a share of mislabelled pairs in "
         "[0, 0.5). Fix: e.g. objective.label_smoothing=0."),
        (o.loss_type == "exo_pair" and o.label_smoothing == 0,
         "objective.loss_type=exo_pair needs objective.label_smoothing > 0. "
         "Fix: objective.label_smoothing=1e-3 (the EXO paper's)."),
        (o.sft_weight < 0,
         f"objective.sft_weight={o.sft_weight}: a loss weight >= 0 (0: none). "
         "Fix: e.g. objective.sft_weight=1.0."),
        (cfg.parallel.tp > 1 or cfg.parallel.sp > 1,
         f"parallel.tp={cfg.parallel.tp} parallel.sp={cfg.parallel.sp} with objective=dpo: "
         "TRL's DPOTrainer runs data parallel only (its batches are not split over "
         "model-parallel ranks). Fix: parallel.tp=1 parallel.sp=1 (ZeRO-3 or FSDP shard "
         "a model too large for one device)."),
    ]) + _loss_type(o.loss_type)


def _loss_type(loss: str) -> list[str]:
    if loss in DPO_LOSS_TYPES:
        return []
    if loss == "sft":
        return ["objective.loss_type=sft: the SFT term is added with objective.sft_weight. "
                "Fix: objective.loss_type=sigmoid objective.sft_weight=1.0."]
    if loss in EXPERIMENTAL_LOSSES:
        return [f"objective.loss_type={loss}: TRL has it only in {EXPERIMENTAL_LOSSES[loss]}, "
                "not in its DPOTrainer, which ftl runs. Fix: one of "
                f"{', '.join(DPO_LOSS_TYPES)} (e.g. sigmoid: DPO, ipo: IPO)."]
    return [f"objective.loss_type={loss}: not one of {', '.join(DPO_LOSS_TYPES)} "
            "(TRL DPOConfig's pair losses). Fix: pick one, e.g. sigmoid."]
