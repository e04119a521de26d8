"""Write requirements.lock from the environment this interpreter runs in.

    .venv-latest/bin/python scripts/write_lock.py requirements.lock

Every installed distribution but torch (scripts/setup.sh installs it from TORCH_SPEC),
implicitlm itself and pip, at its exact version, with the SHA-256 of every file the package
index holds for that version (so the lock installs on any platform those files cover), as
pip's --require-hashes mode reads them. The index is pip's (PIP_INDEX_URL, else PyPI),
asked through its JSON simple API. The file is written to a temporary name and renamed.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import ssl
import sys
import urllib.request
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

# mamba-ssm is an sdist built against the installed torch: requirements-kernels.lock pins it,
# and scripts/setup.sh installs it after torch.
NOT_LOCKED = {"torch", "implicitlm", "pip", "mamba-ssm"}
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def installed() -> dict[str, str]:
    """Canonical name -> version of every distribution to lock."""
    found = {canonicalize_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions()}
    return {name: version for name, version in sorted(found.items()) if name not in NOT_LOCKED}


def file_version(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except ValueError:  # an old upload whose name follows neither convention
        return None


def index_hashes(name: str, version: str, context: ssl.SSLContext) -> list[str]:
    request = urllib.request.Request(f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60, context=context) as response:
        files = json.load(response)["files"]
    wanted = Version(version)
    hashes = sorted({f["hashes"]["sha256"] for f in files if "sha256" in f["hashes"] and file_version(f["filename"]) == wanted})
    if not hashes:
        raise SystemExit(f"error: the index lists no file of {name}=={version} with a SHA-256")
    return hashes


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: python scripts/write_lock.py OUTPUT")
    output = Path(argv[0])
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT"))
    torch_version = metadata.version("torch")
    lines = [
        "# Exact versions and hashes of everything scripts/setup.sh installs, but torch (from TORCH_SPEC)",
        "# and implicitlm itself. Written by scripts/lock.sh after the test suite passed on these versions:",
        f"# {datetime.date.today().isoformat()}, Python {platform.python_version()}, {platform.system()} {platform.machine()}, "
        f"torch {torch_version}.",
        "# Not edited by hand: `bash scripts/lock.sh` refreshes it (see docs/development, The lock).",
    ]
    for name, version in installed().items():
        hashes = index_hashes(name, version, context)
        lines.append(f"{name}=={version} \\")
        lines += [f"    --hash=sha256:{digest} \\" for digest in hashes[:-1]]
        lines.append(f"    --hash=sha256:{hashes[-1]}")
    temporary = output.with_name(f".{output.name}.tmp")
    temporary.write_text("\n".join(lines) + "\n")
    temporary.replace(output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
