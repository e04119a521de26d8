#!/usr/bin/env bash
# Sets up .venv and runs the state-tracking demo (implicit vs explicit Mamba2; recipes/words.py) on CPU.
# Its results go to demo_out, which a rerun replaces; DEMO_OUT=DIR writes DIR, never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -n "${DEMO_OUT:-}" ]; then
    exec .venv/bin/implicitlm demo --out "$DEMO_OUT" "$@"
fi
exec .venv/bin/implicitlm demo --out demo_out --overwrite "$@"
