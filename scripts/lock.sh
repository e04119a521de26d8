#!/usr/bin/env bash
# Refreshes requirements.lock: resolves the newest releases the package metadata admits
# (scripts/setup-latest.sh, UPSTREAM_PINS honoured), runs the whole test suite on them,
# and only if it passes writes their exact versions and hashes to requirements.lock.
# Commit the new lock with what the upgrade needed: an upgrade is a tested decision.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-latest.sh
.venv-latest/bin/python -m pytest
.venv-latest/bin/python scripts/write_lock.py requirements.lock
echo "wrote requirements.lock; bash scripts/setup.sh rebuilds .venv from it"
