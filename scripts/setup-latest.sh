#!/usr/bin/env bash
# Creates .venv-latest afresh with the newest releases that the package metadata admits
# (no lock), for scripts/test-latest.sh and scripts/lock.sh. UPSTREAM_PINS: extra
# requirements to hold some packages elsewhere, e.g. UPSTREAM_PINS="transformers==5.23.0"
# to try the oldest release the metadata admits.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
read -r -a pins <<< "${UPSTREAM_PINS:-}"
rm -rf .venv-latest
"$PYTHON" -m venv .venv-latest
pip=(.venv-latest/bin/python -m pip)
echo "installing $TORCH_SPEC ..."
"${pip[@]}" install --quiet "$TORCH_SPEC"
echo "installing implicitlm with the newest releases its metadata admits ${pins[*]:+(held: ${pins[*]})} ..."
# setuptools and wheel too: the lock carries the build tools that set-up builds implicitlm with.
"${pip[@]}" install --quiet --upgrade setuptools wheel
# No --upgrade: it would replace the torch build installed above.
"${pip[@]}" install --quiet -e ".[test]" ${pins[@]+"${pins[@]}"}
"${pip[@]}" check
