#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py, which says what each step does):
#   bash scripts/gpu-check.sh --prepare                 here, with a network: the wheels, into .gpuwheels/
#   bash scripts/gpu-check.sh [--out DIR] [--budget S]  on the GPU machine: its own python3 runs every step
#   bash scripts/gpu-check.sh --rehearse [--out DIR]    here, from .venv: the same steps on the CPU, tiny
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
for arg in "$@"; do
  case "$arg" in
    --prepare|--rehearse) python=.venv/bin/python ;;
  esac
done
exec "$python" benchmarks/gpu_check.py "$@"
