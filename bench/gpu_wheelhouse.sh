#!/usr/bin/env bash
# A wheelhouse for bench/gpu.sh on a GPU machine that reaches no package registry (a
# cluster's compute node, an air-gapped box): run it here, copy DIR there, then
#
#     WHEELS=DIR bash bench/gpu.sh
#
# which installs these wheels with --no-deps beside that machine's own CUDA torch.
#
#     bash bench/gpu_wheelhouse.sh DIR [NAME==VERSION ...]
#     HAVE=FILE bash bench/gpu_wheelhouse.sh DIR     # less what that machine holds
#
# Without names: what ftlaunch needs at run time with EXTRAS ("eval": lm-evaluation-harness
# for the eval row), every dependency followed, at the versions of this checkout's tested
# venv (.venv; bench/wheel_closure.py), so the GPU machine runs what the tests ran, except
# torch and the NVIDIA/Triton stack (the machine's CUDA torch stays), plus
# bench/gpu_only.txt (liger-kernel for the Liger row, 0.9 MB); EXTRAS=eval,qlora adds
# bitsandbytes (QLoRA's row; a 43 MB wheel). HAVE: the machine's `pip list
# --format=freeze` (or bare names where versions are unknown, as bench/gpu_image.txt): a
# package it holds at a version every requirement accepts is left out (for that image: 42
# wheels with liger-kernel, 53 MB, against 265 MB for the whole tested venv). With names: only those. PY
# (3.12) and PLATFORM (manylinux x86_64) say which machine the wheels are for. DeepSpeed,
# antlr4 (Hydra's parser) and lm-eval's rouge_score, sqlitedict and word2number publish no
# wheel: they are built here, pure Python (DS_BUILD_OPS=0: no op is compiled; the
# benchmark uses torch's AdamW).
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
    mapfile -t WANTED < <("$VENV_PY" "$ROOT/bench/wheel_closure.py" \
        --extras "${EXTRAS:-eval}" ${HAVE:+--have "$HAVE"})
    mapfile -t -O "${#WANTED[@]}" WANTED < <(sed -e 's/#.*//' -e '/^ *$/d' \
        "$ROOT/bench/gpu_only.txt" | tr -d ' ')
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
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
           manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$tag")
done
binary() {
    "$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" \
        --implementation cp "${PLATFORMS[@]}" -d "$DIR" "$@" 2>/dev/null
}
# One download for all; if one has no wheel for that machine (lm-eval's rouge_score,
# sqlitedict and word2number publish only their pure-Python source), one at a time, and
# those without a wheel are built here like DeepSpeed.
if [ ${#BINARY[@]} -gt 0 ] && ! binary "${BINARY[@]}"; then
    for spec in "${BINARY[@]}"; do
        binary "$spec" || SOURCE_ONLY+=("$spec")
    done
fi
# --no-build-isolation: DeepSpeed's setup.py imports torch; this venv's CPU torch serves.
if [ ${#SOURCE_ONLY[@]} -gt 0 ]; then
    DS_BUILD_OPS=0 "$VENV_PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" \
        "${SOURCE_ONLY[@]}"
fi
ls "$DIR"
du -sh "$DIR"
