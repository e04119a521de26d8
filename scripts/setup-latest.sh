#!/usr/bin/env bash
# Creates .venv-latest afresh with the newest releases that the package metadata admits
# (no lock), for scripts/test-latest.sh and scripts/lock.sh. UPSTREAM_PINS: extra
# requirements to hold some packages elsewhere, e.g. UPSTREAM_PINS="transformers==5.23.0"
# to try the oldest release the metadata admits.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/kernels.sh
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
# The gpu-check extra but mamba-ssm, which install_kernels builds without its dependencies.
mapfile -t gpu_check < <(.venv-latest/bin/python -c '
import tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gpu-check"]
print("\n".join(r for r in extra if not r.startswith("mamba-ssm")))')
# No --upgrade: it would replace the torch build installed above.
"${pip[@]}" install --quiet -e ".[test]" "${gpu_check[@]}" ${pins[@]+"${pins[@]}"}
install_kernels "${pip[@]}"
check_installed "${pip[@]}"
