#!/usr/bin/env bash
# Sets up .venv and runs the state-tracking demo (implicit vs explicit Mamba2) on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/implicitlm demo --out "${DEMO_OUT:-demo_out}" "$@"
