#!/usr/bin/env bash
# The GPU benchmark, one command on a single-GPU machine (issue #12, item 4):
#
#     bash bench/gpu.sh            # from a checkout of this repository; nothing else needed
#
# Needs: the NVIDIA driver, python3 (>= 3.10) and pip with access to PyPI. No CUDA toolkit
# (nvcc): torch's PyPI wheel bundles the CUDA runtime, cuDNN and NCCL, and the runs use
# `train.optimizer=torch`, the Trainer's torch AdamW (torch's fused CUDA kernel, as fast as
# DeepSpeed's FusedAdam), so DeepSpeed never JIT-compiles an op (FusedAdam needs nvcc).
#
# What it does (budget: under 8 minutes, installation included; each phase is timed):
#   1. a venv (.venv-gpu) with torch==2.13.0 from PyPI (the CUDA build) and this project;
#   2. picks the GPU preset from the device name (FTL_GPU_PRESET=... overrides);
#   3. a ~1.1B-parameter Llama built from config (hidden 2048, 16 layers, 32 heads, 8 KV
#      heads, MLP 8192, vocab 32000; no hub), bf16, on synthetic text rows of exactly
#      dataset.max_length=2048 tokens (no padding, no packing), micro batch $MICRO;
#   4. `ftl train` under zero2, zero3 and fsdp, $STEPS steps each, and reports per strategy:
#      tokens/s (steps 6..$STEPS, bench.callbacks.StepClock), achieved TFLOP/s
#      (plan.json's FLOPs per token x tokens/s), MFU against the preset's dense bf16 peak,
#      peak memory (torch.cuda.max_memory_allocated) against the estimator's model states
#      + activations (the 1.5 GiB framework allowance is not allocator memory), the peak of
#      each phase (construction, first step, steady; bench.callbacks.GpuMemoryPhases, with
#      max_memory_reserved), and the start-up phases every run logs;
#   5. writes bench/results/gpu.json and prints one table.
# The checkpoint the Trainer writes after the last step is skipped (bench.callbacks.
# NoFinalCheckpoint: ~17 GB of optimizer states per run); the final model is saved, and
# each run dir is deleted once read (disk).
#
# Knobs (environment): VENV, STEPS (30), MICRO (4), STRATEGIES ("zero2 zero3 fsdp"; an item
# may carry overrides after colons: "zero3:strategy.bucket_size=50000000"),
# FTL_GPU_PRESET, KEEP=1 (keep the run dirs), WORK (scratch dir), RESULTS (bench/results),
# RUN_TIMEOUT (420 s per strategy), GPUS (1: ranks on this machine).
# Tensor and sequence parallelism need 2+ GPUs (one H200 cannot show them): on such a
# machine, GPUS=2 STRATEGIES="zero3 zero1:parallel.tp=2 zero3:parallel.sp=2" adds a TP and
# an SP row (tokens/s, peak memory vs the estimate) beside plain zero3 on the same 2 GPUs.
#
# Offline (a machine that reaches no package registry, such as a cluster's compute node):
# WHEELS=DIR installs every wheel in DIR (made elsewhere by bench/gpu_wheelhouse.sh) with
# --no-deps into SITE (.venv-gpu/site) beside the machine's own CUDA torch, and runs with
# PYTHON (python3). It then lists every requirement (pyproject.toml's ranges: a torch >= 2.6
# is accepted) the machine does not meet and goes on: the runs show whether it matters.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${VENV:-$ROOT/.venv-gpu}
export STEPS=${STEPS:-30} MICRO=${MICRO:-4} STRATEGIES=${STRATEGIES:-"zero2 zero3 fsdp"}
export WORK=${WORK:-$(mktemp -d /tmp/ftl-gpu-bench.XXXXXX)}
export KEEP=${KEEP:-0} FTL_GPU_PRESET=${FTL_GPU_PRESET:-}
START=$(date +%s)
say() { echo "[gpu.sh +$(($(date +%s) - START))s] $*"; }

command -v nvidia-smi >/dev/null || { echo "gpu.sh: nvidia-smi not found: no NVIDIA driver" >&2; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# 1. Install. DS_BUILD_OPS=0: DeepSpeed installs without building any op (none is used).
if [ -n "${WHEELS:-}" ]; then
    PY=${PYTHON:-python3}
    SITE=${SITE:-$ROOT/.venv-gpu/site}
    say "offline: installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --disable-pip-version-check --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
    if ! "$PY" - <<'PY'
import tomllib
from importlib.metadata import PackageNotFoundError, version
from packaging.requirements import Requirement

unmet = []
for text in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    req = Requirement(text)
    try:
        have = version(req.name)
    except PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have, prereleases=True):
        unmet.append(f"{req} (here: {have or 'missing'})")
print("offline: requirements this machine does not meet: " + ("; ".join(unmet) or "none"))
PY
    then
        say "offline: could not check the requirements (going on)"
    fi
else
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV" 2>/dev/null || {
            python3 -m pip install -q --user virtualenv && python3 -m virtualenv -q "$VENV"; }
    fi
    PIP=("$VENV/bin/python" -m pip install -q --progress-bar off --disable-pip-version-check)
    "${PIP[@]}" --upgrade pip
    say "installing torch==2.13.0 (CUDA wheel from PyPI) and the project"
    DS_BUILD_OPS=0 "${PIP[@]}" torch==2.13.0
    DS_BUILD_OPS=0 "${PIP[@]}" -e .
    PY=$VENV/bin/python
fi
INSTALLED=$(($(date +%s) - START))
say "installed in ${INSTALLED}s"
export INSTALLED

# 2-5. Runs and report.
"$PY" - <<'PY'
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

root, work = Path.cwd(), Path(os.environ["WORK"])
steps, micro = int(os.environ["STEPS"]), int(os.environ["MICRO"])
run_timeout = int(os.environ.get("RUN_TIMEOUT") or 420)
strategies = os.environ["STRATEGIES"].split()
if not torch.cuda.is_available():
    sys.exit(f"gpu.sh: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: "
             "is the driver new enough for this CUDA build?")
name = torch.cuda.get_device_name(0)
gib = torch.cuda.get_device_properties(0).total_memory / 2**30


def preset_for(device: str, memory_gib: float) -> str:
    if os.environ.get("FTL_GPU_PRESET"):
        return os.environ["FTL_GPU_PRESET"]
    for key, preset in (("H200", "h200-141g"), ("H100", "h100-80g"), ("V100", "v100-32g")):
        if key in device:
            return preset
    if "A100" in device:
        return "a100-80g" if memory_gib > 60 else "a100-40g"
    sys.exit(f"gpu.sh: no preset for {device!r} ({memory_gib:.0f} GiB); set FTL_GPU_PRESET "
             "to the closest of launcher/config/hardware.py's presets")


preset = preset_for(name, gib)
if preset == "v100-32g":
    sys.exit("gpu.sh: a V100 has no bf16; this benchmark is bf16")
print(f"GPU: {name}, {gib:.0f} GiB, preset {preset}; torch {torch.__version__} "
      f"CUDA {torch.version.cuda}", flush=True)

# Synthetic text: every row longer than max_length, so each row is exactly 2048 tokens.
data = work / "text.jsonl"
rows = max(64, steps * micro)
rng = random.Random(0)
words = "alpha beta gamma delta epsilon sum of the numbers sort these digits reverse".split()
with data.open("w") as out:
    for _ in range(rows):
        out.write(json.dumps({"text": " ".join(rng.choices(words, k=3000))}) + "\n")

MODEL = ["model=tiny-llama", "model.name=llama-1b", "model.hidden_size=2048",
         "model.num_layers=16", "model.num_heads=32", "model.num_kv_heads=8",
         "model.intermediate_size=8192", "model.vocab_size=32000",
         "model.max_position_embeddings=2048"]
COMMON = [*MODEL, f"dataset.path={data}", "dataset.format=text", "dataset.eval_path=",
          "dataset.eval_fraction=0", "dataset.max_length=2048", "dataset.packing=false",
          f"dataset.cache_dir={work / 'data'}", "precision=bf16", f"cluster.gpu={preset}",
          f"cluster.gpus_per_node={os.environ.get('GPUS') or 1}", f"train.max_steps={steps}",
          f"train.micro_batch_size={micro}", "train.grad_accum=1", "train.lr=1e-4",
          "train.warmup_ratio=0.1", "train.logging_steps=5", "train.eval_steps=0",
          "train.save_steps=100000", "train.eval_on_start=false", "train.optimizer=torch",
          "train.show_examples=0"]
WARM = 5
entries, table, peak = [], [], None
for index, strategy in enumerate(strategies):
    # "zero3:strategy.bucket_size=50000000": a strategy with extra overrides (an A/B in one call)
    base_strategy, *extra = strategy.split(":")
    out, clock = work / f"out-{index}", work / f"clock-{index}"
    callbacks = (f"train.callbacks=[{{_target_:bench.callbacks.StepClock,out:{clock}}},"
                 f"{{_target_:bench.callbacks.GpuMemoryPhases,out:{clock}}},"
                 "{_target_:bench.callbacks.NoFinalCheckpoint}]")
    argv = [sys.executable, "-m", "launcher", "train", *COMMON, f"strategy={base_strategy}",
            *extra, f"run.output_dir={out}", callbacks]
    began = time.time()
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=run_timeout)
    except subprocess.TimeoutExpired:
        # ftl train's second Ctrl-C kills the launcher and every rank (a kill would orphan them)
        proc.send_signal(signal.SIGINT)
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate()
        print(f"{strategy}: TIMED OUT after {run_timeout} s\n{stdout[-3000:]}\n{stderr[-3000:]}",
              flush=True)
        continue
    wall = time.time() - began
    if proc.returncode != 0:
        print(f"{strategy}: FAILED (exit {proc.returncode}, {wall:.0f} s)\n"
              f"{stdout[-3000:]}\n{stderr[-3000:]}", flush=True)
        continue
    (run_dir,) = out.glob("*/*/")
    record = json.loads((clock / "clock-rank0.json").read_text())
    points = [(s, t, n) for s, t, n, *_ in record["steps"] if s >= WARM]
    thirds = [points[i * (len(points) - 1) // 3: (i + 1) * (len(points) - 1) // 3 + 1]
              for i in range(3)]
    speeds = [(w[-1][2] - w[0][2]) / (w[-1][1] - w[0][1]) for w in thirds if len(w) > 1]
    tokens_per_s = (points[-1][2] - points[0][2]) / (points[-1][1] - points[0][1])
    plan = json.loads((run_dir / "plan.json").read_text())
    achieved = plan["flops_per_token"] * tokens_per_s
    peak = plan["peak_flops_per_device"]
    row = plan["estimate"]  # the estimator's row for this run's strategy
    # the predicted peak of live tensor bytes (launcher/estimator/peak.py), the quantity measured
    estimated = row.get("peak_bytes") or row["model_state_gpu_bytes"] + row["activation_bytes"]
    # peak per phase (bench.callbacks.GpuMemoryPhases), MiB: the run's peak is their maximum
    phases = json.loads((clock / "memory-rank0.json").read_text())["phases"]
    phases_mib = {phase: {key: round(value / 2**20) for key, value in peaks.items()}
                  for phase, peaks in phases.items()}
    measured = max(peaks["allocated"] for peaks in phases.values()) / 2**20
    startup = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") in ("startup", "finish"):
            startup.update(event[event["event"]])
    spread = max(speeds) / min(speeds) if speeds else 1.0
    common = {"strategy": strategy, "gpu": name, "preset": preset, "runs": 1,
              "windows": len(speeds), "spread": spread, "wall_s": wall}
    entries += [
        {"name": f"{strategy} tok/s (vs zero2)", "ours": tokens_per_s, "baseline": None,
         "ratio": None, "unit": "tokens/s", **common},
        {"name": f"{strategy} TFLOP/s (MFU)", "ours": achieved / 1e12, "baseline": peak / 1e12,
         "ratio": achieved / peak, "unit": "TFLOP/s", **common},
        {"name": f"{strategy} peak mem (meas/est)", "ours": measured / 1024,
         "baseline": estimated / 2**30, "ratio": measured * 2**20 / estimated, "unit": "GiB",
         **common, "startup": startup, "memory_phases_mib": phases_mib},
    ]
    table.append(f"{strategy:<8} {tokens_per_s:>11.0f}{achieved / 1e12:>9.1f}"
                 f"{achieved / peak:>7.1%}{measured / 1024:>10.1f}{estimated / 2**30:>9.1f}"
                 f"{spread:>8.2f}{wall:>7.0f}")
    print(f"{strategy}: {tokens_per_s:.0f} tok/s, {achieved / 1e12:.1f} TFLOP/s, MFU "
          f"{achieved / peak:.1%}, peak {measured / 1024:.1f} GiB (est {estimated / 2**30:.1f}),"
          f" run {wall:.0f} s; start-up {startup}; memory by phase (MiB) {phases_mib}",
          flush=True)
    if os.environ.get("KEEP") != "1":
        subprocess.run(["rm", "-rf", str(out)], check=False)

base = next((e["ours"] for e in entries if e["name"].startswith("zero2 tok/s")), None)
for e in entries:
    if e["unit"] == "tokens/s" and base:
        e["baseline"], e["ratio"] = base, e["ours"] / base
results = Path(os.environ.get("RESULTS") or root / "bench" / "results")
results.mkdir(parents=True, exist_ok=True)
(results / "gpu.json").write_text(json.dumps(entries, indent=2) + "\n")
print(f"\n{name} ({preset}, peak {(peak or 0) / 1e12:.0f} TFLOP/s bf16), 1.1B Llama, "
      f"bf16, micro batch {micro} x 2048 tokens, {steps} steps, torch fused AdamW")
print(f"{'strategy':<8} {'tokens/s':>11}{'TFLOP/s':>9}{'MFU':>7}{'peak GiB':>10}{'est GiB':>9}"
      f"{'spread':>8}{'run s':>7}")
print("\n".join(table))
print(f"written: {results / 'gpu.json'}")
PY
END=$(date +%s)
say "done: install ${INSTALLED}s, total $((END - START))s (budget 480s)"
