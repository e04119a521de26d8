#!/usr/bin/env bash
# Runs the test suite against the newest releases the package metadata admits, without the
# lock, in a fresh .venv-latest: a release upstream that breaks implicitlm shows here
# before anyone locks it. Arguments go to pytest. To try an older release, hold it:
#   UPSTREAM_PINS="transformers==5.23.0" bash scripts/test-latest.sh tests/models/test_generation.py
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-latest.sh
.venv-latest/bin/python -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}')"
exec .venv-latest/bin/python -m pytest "$@"
