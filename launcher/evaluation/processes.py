"""eval.processes > 1: data-parallel evaluation over a node's GPUs, the harness's own path.
`accelerate launch` starts that many copies of worker.py; each loads the tasks (offline)
and the model by path onto its GPU, and HFLM gives each process its share of the examples;
the first process gathers the scores and writes the eval dir as one process would. This
process only starts them and reads summary.json back. GPUs only: HFLM splits examples when
it sees more than one CUDA device, so on CPU every process would score every example
(measured: docs/evidence/stack.md), and ftl refuses it there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

from launcher.config.schema import EvalConfig
from launcher.rundir import EvalDir, EvalSummary

REQUEST = "request.json"
"""The workers' arguments, in the eval dir while they run."""


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def processes_problem(ev: EvalConfig, kind: str, gpus: int) -> str | None:
    """eval.processes against what is evaluated (`kind`: plain, adapter, quantized) and the
    GPUs this machine has; None when it can run."""
    n = ev.processes
    if n <= 1:
        return None
    if kind != "plain":
        article = "an" if kind[0] in "aeiou" else "a"
        return (f"eval.processes={n} with {article} {kind} model: ftl loads it itself, in one "
                "process. Fix: eval.processes=1 (or evaluate the merged model/).")
    if n > gpus:
        return (f"eval.processes={n}: this machine has {gpus} GPU(s), and the harness splits "
                "examples only across GPUs (on CPU each process would score every example). "
                f"Fix: eval.processes={max(gpus, 1)}.")
    return None


def shard_problem(gpus: int) -> str | None:
    """eval.shard against this machine: the harness splits a model over CUDA devices only
    (on CPU it fails at the first batch: "Torch not compiled with CUDA enabled")."""
    if gpus:
        return None
    return ("eval.shard=true (--shard): this machine has no GPU, and the harness splits a "
            "model over GPUs only. Fix: leave --shard out (one process scores it here).")


def launch_argv(processes: int, request: str) -> list[str]:
    """accelerate launch with every setting ftl relies on given, so none comes from the
    user's default accelerate config (a gpu_ids there would narrow CUDA_VISIBLE_DEVICES
    below the GPUs processes_problem counted; accelerate 1.16 launch.py)."""
    argv = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes",
            str(processes), "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--gpu_ids", "all"]
    if processes > 1:
        argv.append("--multi_gpu")
    return [*argv, "--module", "launcher.evaluation.worker", request]


def evaluate_in_processes(model: str, ev: EvalConfig, eval_dir: EvalDir, name: str,
                          label: str, processes: int) -> EvalSummary:
    """`processes` workers under accelerate launch score `model` (a dir's path) into
    eval_dir; its summary, read back."""
    request = eval_dir.path / REQUEST
    request.write_text(json.dumps({"model": model, "eval": asdict(ev), "name": name,
                                   "label": label}))
    try:
        done = subprocess.run(launch_argv(processes, str(request)), check=False)
    finally:
        request.unlink(missing_ok=True)
    summary = eval_dir.read_summary()
    if done.returncode != 0 or summary is None:
        raise RuntimeError(f"ftl eval: the {processes} evaluation processes failed (exit "
                           f"{done.returncode}; their output is above).")
    return summary
