"""The router's load-balancing loss of an MoE run, logged as `aux_loss` beside the loss."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.rank.preempt import collective_device


class RouterAuxLoss(TrainerCallback):
    """An HF MoE model built with output_router_logits (launcher/rank/model.py) returns
    `aux_loss`, E x the sum over experts of (share of the tokens routed there) x (mean
    router probability): experts_per_token when perfectly balanced, more as routing
    collapses. Its forward already adds router_aux_loss_coef x it to the loss, which the
    Trainer logs as one number; this shows the term itself.

    A forward hook on the model sums the training forwards' aux_loss on the device
    (detached: no host sync per micro batch); at each log event with the training loss,
    where every rank logs, one all-reduce averages every rank's micro batches since the
    last one into logs["aux_loss"]. Installed ahead of MetricsCallback, so TensorBoard and
    metrics.jsonl get it. objective=dpo does without it: TRL's DPOTrainer logs its own."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.count = 0

    @classmethod
    def install(cls, trainer: Any) -> RouterAuxLoss:
        callback = cls()
        trainer.model.register_forward_hook(callback.record)
        trainer.callback_handler.callbacks.insert(0, callback)
        return callback

    @torch.compiler.disable  # under train.compile: eager, not traced into the model's graph
    def record(self, module: Any, args: Any, output: Any) -> None:
        aux = getattr(output, "aux_loss", None)
        if not module.training or not isinstance(aux, torch.Tensor):
            return  # evaluation forwards, or a model that returns none
        value = aux.detach().float()
        self.total = value if self.total is None else self.total + value
        self.count += 1

    def mean_since_last(self) -> float | None:
        """Every rank's aux_loss averaged over their micro batches since the last call
        (a collective when distributed: every rank calls it); None when none ran."""
        distributed = dist.is_available() and dist.is_initialized()
        stats = torch.zeros(2, device=collective_device() if distributed else "cpu")
        if self.total is not None:
            stats[0], stats[1] = self.total, float(self.count)
        if distributed:  # every rank, even one without a forward since the last call
            dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        self.total, self.count = None, 0
        total, count = stats.tolist()
        return total / count if count else None

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        logs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:
        if not logs or "loss" not in logs:  # the training loss: every rank logs it
            return
        mean = self.mean_since_last()
        if mean is not None:
            logs["aux_loss"] = mean
