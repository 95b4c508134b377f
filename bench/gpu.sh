#!/usr/bin/env bash
# The GPU check, one command on a single-GPU machine (issue 34, item 5; `make test-gpu`;
# before it, issue #12 item 4's strategy benchmark):
#
#     bash bench/gpu.sh            # from a checkout of this repository; nothing else needed
#     bash bench/gpu.sh --plan     # (or PLAN=1) anywhere: the plan only, nothing installed
#     bash bench/gpu.sh --dry      # every row on this CPU at toy sizes with .venv (~2 min):
#                                  # the matrix's own code checked before a GPU runs it
#
# Needs: the NVIDIA driver, python3 (>= 3.10) and pip with access to PyPI (or WHEELS, below).
# No CUDA toolkit (nvcc): torch's PyPI wheel bundles the CUDA runtime, cuDNN and NCCL, and the
# runs use `train.optimizer=torch`, the Trainer's torch AdamW (torch's fused CUDA kernel, as
# fast as DeepSpeed's FusedAdam), so DeepSpeed never JIT-compiles an op (FusedAdam needs nvcc).
#
# What it does (budget: BUDGET_S=480 s, installation included; each phase is timed):
#   1. a venv (.venv-gpu) with torch==2.13.0 from PyPI (the CUDA build), this project with
#      [qlora,eval] (bitsandbytes, lm-evaluation-harness) and bench/gpu_only.txt
#      (liger-kernel); flash-attn only from a prebuilt wheel (FLASH_ATTN_WHEEL=file-or-URL,
#      else whatever PyPI offers within 60 s: it publishes the source only, whose build
#      takes far longer than the budget),
#      else the FlashAttention rows are skipped with that reason;
#   2. bench/gpu_matrix.py: the matrix, one short `ftl train` per row on this GPU (the GPU
#      preset from the device name; FTL_GPU_PRESET=... overrides): ddp, zero2, zero3 and
#      fsdp in bf16, ddp in fp16 AMP, QLoRA, `ftl eval` of the ddp row's model (one
#      process, then --shard, or --processes N with GPUS=N), each attention kernel
#      installed, Liger on, torch.compile on, an MoE under ZeRO-3, packing (sdpa, and
#      FlashAttention-2's varlen kernel where it imports); per row: passed,
#      tokens/s, TFLOP/s, MFU, the predicted peak (plan.json) against the measured one (the
#      run's own torch.cuda.max_memory_allocated, per phase), the start-up phases; a failed
#      row keeps its error's tail and the next runs; a row that no longer fits the budget
#      is skipped (ROWS=name runs it alone). `bash bench/gpu.sh --plan` prints the rows,
#      overrides and budget; gpu_matrix.py's docstring has the rest;
#   3. writes bench/results/gpu_matrix.json (gpu_matrix-partial.json with ROWS or
#      STRATEGIES) and prints one table. Exit 1 when a row failed or timed out.
# The checkpoint the Trainer writes after the last step is skipped (bench.callbacks.
# NoFinalCheckpoint: ~17 GB of optimizer states per run); the final model is saved, and
# each run dir is deleted once read (disk), the ddp-bf16 row's model once QLoRA has used it.
#
# Knobs (environment): VENV, STEPS (12), MICRO (4), ROWS ("zero3-bf16 liger": a subset),
# STRATEGIES (instead of the matrix, one bf16 row per item; an item may carry overrides
# after colons: "zero3:strategy.bucket_size=50000000"), BUDGET_S (480), FTL_GPU_PRESET,
# KEEP=1 (keep the run dirs), WORK (scratch dir), RESULTS (bench/results), GPUS (1: ranks on
# this machine), FLASH_ATTN_WHEEL, CHECK=0 (--plan without `ftl plan` of each row). Bad
# ROWS, STEPS (at least 5), MICRO, GPUS or BUDGET_S: one message, exit 2, before installing.
# Tensor and sequence parallelism need 2+ GPUs (one H200 cannot show them): on such a
# machine, GPUS=2 STRATEGIES="zero3 zero1:parallel.tp=2 zero3:parallel.sp=2" adds a TP and
# an SP row (tokens/s, peak memory vs the estimate) beside plain zero3 on the same 2 GPUs.
#
# Offline (a machine that reaches no package registry, such as a cluster's compute node):
# WHEELS=DIR installs every wheel in DIR (made elsewhere by bench/gpu_wheelhouse.sh: what
# ftl and lm-eval need, less what HAVE=FILE says the machine holds; EXTRAS=eval,qlora adds
# bitsandbytes for QLoRA's row, 125 MB installed, else that row is skipped; the Liger row's
# 0.9 MB wheel comes with the rest, from bench/gpu_only.txt) with
# --no-deps into SITE (.venv-gpu/site) beside the machine's own CUDA torch, and runs with
# PYTHON (python3). SITE stays: a second run with another DIR adds its wheels (bitsandbytes'
# 43 MB wheel alone, then ROWS="ddp-bf16 qlora", where one copy cannot carry it all). It
# then lists every requirement (pyproject.toml's ranges: a torch >= 2.6 is accepted) the
# machine does not meet and goes on: the runs show whether it matters.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# Every model, tokenizer and task of the check is local, and a lent GPU machine reaches
# nothing outside: offline, what asks the Hub anyway (bitsandbytes' import fetches a CPU
# kernel on AVX512-BF16 hosts) fails at once instead of after a network timeout per rank.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
if [ "${1:-}" = --plan ] || [ "${PLAN:-0}" = 1 ]; then
    # The plan installs nothing; with the project's venv it also `ftl plan`s every row here.
    if [ -x "$ROOT/.venv/bin/python" ] && [ "${CHECK:-1}" = 1 ]; then
        exec "$ROOT/.venv/bin/python" bench/gpu_matrix.py --plan --check
    fi
    exec python3 bench/gpu_matrix.py --plan
fi
if [ "${1:-}" = --dry ]; then
    exec "$ROOT/.venv/bin/python" bench/gpu_matrix.py --dry
fi
# The knobs (ROWS, STEPS, MICRO, GPUS, BUDGET_S) checked before a minute goes into installing.
python3 bench/gpu_matrix.py --validate || exit 2
command -v nvidia-smi >/dev/null || {
    echo "gpu.sh: nvidia-smi not found: no NVIDIA driver (bash bench/gpu.sh --plan: the plan)" >&2
    exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
VENV=${VENV:-$ROOT/.venv-gpu}
export STEPS=${STEPS:-12} MICRO=${MICRO:-4} BUDGET_S=${BUDGET_S:-480}
export WORK=${WORK:-$(mktemp -d /tmp/ftl-gpu-check.XXXXXX)}
export KEEP=${KEEP:-0} FTL_GPU_PRESET=${FTL_GPU_PRESET:-}
START=$(date +%s)
export GPU_CHECK_START=$START INSTALL_NOTES=$WORK/install-notes.txt
: >"$INSTALL_NOTES"
say() { echo "[gpu.sh +$(($(date +%s) - START))s] $*"; }
note() { echo "$1: $2" >>"$INSTALL_NOTES"; say "not installed: $1 ($2)"; }

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
    DS_BUILD_OPS=0 "${PIP[@]}" -e '.[qlora,eval]'
    say "installing bench/gpu_only.txt (liger-kernel) and (a prebuilt wheel only) flash-attn"
    mapfile -t GPU_ONLY < <(sed -e 's/#.*//' -e '/^ *$/d' bench/gpu_only.txt | tr -d ' ')
    "${PIP[@]}" "${GPU_ONLY[@]}" || note liger_kernel "pip install ${GPU_ONLY[*]} failed"
    if [ -n "${FLASH_ATTN_WHEEL:-}" ]; then
        timeout 120 "${PIP[@]}" --no-deps "$FLASH_ATTN_WHEEL" ||
            note flash_attn "FLASH_ATTN_WHEEL=$FLASH_ATTN_WHEEL did not install"
    else
        timeout 60 "${PIP[@]}" --only-binary=:all: flash-attn 2>/dev/null ||
            note flash_attn "no prebuilt flash-attn wheel within 60 s (PyPI publishes its \
source only, whose build takes far longer than this budget); set FLASH_ATTN_WHEEL to a \
wheel built for this torch, CUDA and Python"
    fi
    PY=$VENV/bin/python
fi
"$PY" -c 'import flash_attn_interface' 2>/dev/null ||
    note flash_attn_interface "FlashAttention-3 builds from the flash-attention \
repository's hopper/ folder, outside this budget"
INSTALLED=$(($(date +%s) - START))
say "installed in ${INSTALLED}s"
export INSTALLED

# 2-3. The matrix and its report (bench/gpu_matrix.py), within what is left of BUDGET_S.
STATUS=0
"$PY" bench/gpu_matrix.py || STATUS=$?
END=$(date +%s)
say "done: install ${INSTALLED}s, rows $((END - START - INSTALLED))s, total \
$((END - START))s (budget ${BUDGET_S}s)"
exit "$STATUS"
