#!/usr/bin/env bash
# Creates .venv (if missing) and installs implicitlm with its test extras into it.
# torch comes first and separately: GPU machines set TORCH_SPEC to their own build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "installing $TORCH_SPEC ..."
  .venv/bin/pip install --quiet "$TORCH_SPEC"
fi
# Reinstall only when the package metadata changed.
stamp=.venv/.implicitlm-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing implicitlm and its dependencies ..."
  .venv/bin/pip install --quiet -e ".[test]"
  echo "$want" > "$stamp"
fi
