#!/usr/bin/env bash
# A wheelhouse for bench/gpu.sh on a GPU machine that reaches no package registry (a
# cluster's compute node, an air-gapped box): run it here, copy DIR there, then
#
#     WHEELS=DIR bash bench/gpu.sh
#
# which installs these wheels with --no-deps beside that machine's own CUDA torch.
#
#     bash bench/gpu_wheelhouse.sh DIR [NAME==VERSION ...]
#
# Without names: every package of this checkout's tested venv (.venv, `pip freeze`), so the
# GPU machine runs the versions the tests ran, except torch and the NVIDIA/Triton stack
# (the machine's CUDA torch stays) and bitsandbytes (QLoRA only; the benchmark has none).
# With names: only those (when the machine already holds the rest; check with `pip list`
# there). PY (3.12) and PLATFORM (manylinux x86_64) say which machine the wheels are for.
# DeepSpeed and antlr4 (Hydra's parser) publish no wheel: they are built here, pure Python
# (DS_BUILD_OPS=0: no op is compiled; the benchmark uses torch's AdamW).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:?usage: bash bench/gpu_wheelhouse.sh DIR [NAME==VERSION ...]}
shift
PY=${PY:-3.12}
VENV_PY=${VENV_PY:-$ROOT/.venv/bin/python}
mkdir -p "$DIR"

if [ $# -gt 0 ]; then
    WANTED=("$@")
else
    mapfile -t WANTED < <("$VENV_PY" -m pip freeze --exclude-editable 2>/dev/null |
        grep -viE '^(torch|triton|nvidia-|bitsandbytes|ruff|pytest|pluggy|iniconfig)' |
        grep '==')
fi

SOURCE_ONLY=()
BINARY=()
for spec in "${WANTED[@]}"; do
    case "${spec,,}" in
        deepspeed==*|antlr4-python3-runtime==*) SOURCE_ONLY+=("$spec") ;;
        *) BINARY+=("$spec") ;;
    esac
done

PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$tag")
done
if [ ${#BINARY[@]} -gt 0 ]; then
    "$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" \
        --implementation cp "${PLATFORMS[@]}" -d "$DIR" "${BINARY[@]}"
fi
# --no-build-isolation: DeepSpeed's setup.py imports torch; this venv's CPU torch serves.
if [ ${#SOURCE_ONLY[@]} -gt 0 ]; then
    DS_BUILD_OPS=0 "$VENV_PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" \
        "${SOURCE_ONLY[@]}"
fi
ls "$DIR"
du -sh "$DIR"
