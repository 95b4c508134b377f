"""Resume a ZeRO checkpoint on another world size through DeepSpeed's universal checkpoint
(docs/design.md, "Resume"): rank 0 converts it once into RUN_DIR/universal/checkpoint-N/
(`ds_to_universal` as a subprocess: it runs worker pools of its own) while the other ranks
wait, before any process group exists, so no collective times out however long it takes;
the Trainer loads it with RUN_DIR/ds_config.universal.json (written with the run dir).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from launcher.rundir import UNIVERSAL, RunDir
from launcher.rundir.checkpoints import checkpoint_step, checkpoint_world_size


def needs_universal(checkpoint: Path | None, world_size: int) -> bool:
    """A DeepSpeed checkpoint (global_step* inside) written by another world size."""
    if checkpoint is None or not any(checkpoint.glob("global_step*")):
        return False
    written_by = checkpoint_world_size(checkpoint)
    return written_by is not None and written_by != world_size


def universal_resume(run_dir: RunDir, checkpoint: Path, rank: int, timeout_s: float) -> Path:
    """The converted checkpoint to resume from: rank 0 converts it (once per run dir), the
    other ranks wait for it."""
    target = run_dir.path / UNIVERSAL / checkpoint.name
    if rank == 0 and not target.is_dir():
        convert(checkpoint, target)
    deadline = time.monotonic() + timeout_s
    while not target.is_dir():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no converted checkpoint in {target} after {timeout_s:.0f} s of "
                            "waiting for rank 0. Fix: raise dataset.wait_timeout_s.")
        time.sleep(1.0)
    return target


def convert(checkpoint: Path, target: Path) -> None:
    """ds_to_universal into a staging directory, the Trainer's files linked beside it, then
    one rename: a crash leaves no half-converted checkpoint behind under the final name."""
    step = checkpoint_step(checkpoint)
    staging = target.parent / f".tmp-{target.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    print(f"[ftl] rank 0: converting {checkpoint} (written by "
          f"{checkpoint_world_size(checkpoint)} ranks) to a universal checkpoint", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
         "--input_folder", str(checkpoint / f"global_step{step}"),
         "--output_folder", str(staging / f"global_step{step}_universal"),
         "--inject_missing_state"],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"ds_to_universal failed on {checkpoint}:\n{done.stderr[-3000:]}")
    for item in checkpoint.iterdir():
        if not item.name.startswith("global_step") and item.name != "latest":
            (staging / item.name).symlink_to(item.resolve())
    staging.rename(target)


def untie_optimizer_steps(optimizer: object) -> int:
    """Give every parameter state of the torch optimizer inside `optimizer` its own step
    tensor; returns how many were shared.

    DeepSpeed 0.19.8's ZeRO-3 universal load (stage3.py,
    load_hp_checkpoint_state_from_checkpoint_dir_stage3) assigns ONE step tensor to the
    state of every sub-group, and torch's AdamW increments each state's step in place: with
    the HF Trainer's two parameter groups the shared count rose by 2 per optimizer step, so
    Adam's bias correction ran ahead after a resume on another world size (measured: the
    no-decay group's weights off by rel 1.3e-4 after the first resumed step, the loss by
    2.3e-3 four steps later; exact with the steps untied).
    """
    inner = innermost_optimizer(optimizer)
    seen: set[int] = set()
    shared = 0
    for state in getattr(inner, "state", {}).values():
        step = state.get("step") if isinstance(state, dict) else None
        if step is None or not hasattr(step, "clone"):
            continue
        if id(step) in seen:
            shared += 1
            state["step"] = step.clone()
        seen.add(id(step))
    return shared


def innermost_optimizer(optimizer: object) -> object:
    """The torch optimizer inside accelerate's and DeepSpeed's wrappers (each `.optimizer`)."""
    inner = optimizer
    while getattr(inner, "optimizer", None) is not None:
        inner = inner.optimizer
    return inner


class UntiedOptimizerSteps(TrainerCallback):
    """Installed only on a resume from a universal checkpoint: once DeepSpeed has loaded
    it (before the first step), every optimizer state gets its own step count."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        untie_optimizer_steps(kw.get("optimizer"))
