#!/usr/bin/env bash
# Creates .venv from the lock: every dependency at the exact version and hash that
# requirements.lock names, torch from TORCH_SPEC (GPU machines set it to their own build),
# then implicitlm itself, editable. The venv is rebuilt from nothing whenever the lock, the
# package metadata or TORCH_SPEC changes, so it holds what the lock says and nothing else.
# scripts/lock.sh refreshes the lock; scripts/test-latest.sh tries the newest releases.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/kernels.sh
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
stamp=.venv/.implicitlm-installed
want=$( (cat pyproject.toml requirements.lock requirements-kernels.lock; echo "$TORCH_SPEC") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
rm -rf .venv
"$PYTHON" -m venv .venv
pip=(.venv/bin/python -m pip)
echo "installing the locked dependencies (requirements.lock) ..."
"${pip[@]}" install --quiet --require-hashes --no-deps -r requirements.lock
echo "installing $TORCH_SPEC ..."
# Its own dependencies are in the lock already, so a CPU build adds nothing beside itself.
"${pip[@]}" install --quiet "$TORCH_SPEC"
install_kernels "${pip[@]}"
echo "installing implicitlm ..."
"${pip[@]}" install --quiet --no-deps --no-build-isolation -e .
# A dependency added to pyproject.toml but not yet locked is named here, not at import time.
check_installed "${pip[@]}"
echo "$want" > "$stamp"
