"""Stop at a step boundary with a complete checkpoint when the Slurm job asks for it.

The job's USR1 trap (launcher/slurm.py) touches RUN_DIR/preempt.requested. A file, not a
signal: `--signal=B:USR1` reaches only the batch shell, and whatever sits between srun and
the ranks (torchrun's agent, the deepspeed launcher) would otherwise have to forward it.
Every rank polls the file at each step end; the ranks then agree with an all-reduce (MAX),
because a rank that saw the file one step later would enter the checkpoint's collectives
at a different step than the others and hang. So all ranks save at the same step and stop;
rank 0 records RUN_DIR/preempted so the batch script requeues instead of calling it done.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.rundir import RunDir


class PreemptCallback(TrainerCallback):
    """Save and stop at the next step end once RUN_DIR/preempt.requested exists.

    After `trainer.train()` returns, `preempted` says whether the run stopped early: the
    worker then skips its final evaluation/model save and exits 0 (the checkpoint is the
    state to resume from; the requeued job finishes the run).
    """

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.preempted = False

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.preempted:
            return
        if not agreed(self.requested()):  # a collective: every rank calls it every step
            return
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            return  # the last step: the run finishes (and saves) now, nothing to resume
        self.preempted = True
        control.should_save = True
        control.should_training_stop = True
        if state.is_world_process_zero:
            record = {"step": state.global_step, "time": time.time()}
            self.run_dir.preempted.write_text(json.dumps(record) + "\n")
            print(
                f"[ftl] preemption requested: saving checkpoint-{state.global_step} and "
                "stopping; the requeued job resumes from it",
                flush=True,
            )

    def requested(self) -> bool:
        return self.run_dir.preempt_requested.exists()


def agreed(flag: bool) -> bool:
    """True on every rank when it is True on any rank (all-reduce MAX); local without a group."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    # NCCL reduces CUDA tensors only; gloo (CPU) takes CPU tensors.
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
