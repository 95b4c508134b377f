#!/usr/bin/env bash
# kill -9 a real `ftl train` run N times (default 20), relaunch, check the final model:
#   scripts/chaos.sh N [ftl train overrides...]      (details: scripts/chaos.py)
# PYTHON: the interpreter with ftlaunch installed (default: the checkout's .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
shift || true
exec "${PYTHON:-.venv/bin/python}" scripts/chaos.py --rounds "$rounds" "$@"
