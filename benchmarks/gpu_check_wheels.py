"""The GPU check's ``--prepare``, here with a network: the wheels the GPU image lacks or holds
outside the library's ranges, at the versions and hashes of the lock, into .gpuwheels/, which
travels to the GPU machine with the working tree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu_check_shared import ROOT, WHEELS

from implicitlm.core.atomic_io import staged_directory

# What the GPU image lacks (torchdeq, datasets and those of its dependencies it lacks) or has
# outside our ranges (transformers 5.17 < 5.23), at the versions and hashes of requirements.lock.
# The image's tokenizers 0.23.2 and huggingface_hub 1.33.0 are inside transformers' ranges.
TRAVELLING = ["torchdeq", "transformers", "datasets", "dill", "multiprocess", "xxhash"]
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--only-binary=:all:"]
WHEELS_LIMIT_MIB = 40  # the working tree that travels to the GPU machine is limited to 64 MiB


def prepare() -> None:
    with staged_directory(WHEELS) as staging:
        download_locked(staging)
        build_kernels(staging)
        for wheel in sorted(staging.glob("*.whl")):
            retag_if_pure(wheel)
        check_installable(staging)
    sizes = {wheel.name: wheel.stat().st_size for wheel in sorted(WHEELS.glob("*.whl"))}
    print("\n".join(f"{size / 2**20:7.2f} MiB  {name}" for name, size in sizes.items()))
    print(f"{sum(sizes.values()) / 2**20:7.2f} MiB in {WHEELS.relative_to(ROOT)}/")


def download_locked(folder: Path) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        requirements.write(locked_entries(ROOT / "requirements.lock", TRAVELLING))
        requirements.flush()
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", *PLATFORM,
                        "-d", str(folder), "-r", requirements.name], check=True)


def locked_entries(lock: Path, names: list[str]) -> str:
    """The lock's entries (``name==version`` and its ``--hash`` lines) of ``names``."""
    entries = re.finditer(r"^([A-Za-z0-9._-]+)==\S+ \\\n(?:[ \t]+.*\n)*", lock.read_text(), flags=re.MULTILINE)
    found = {canonical(entry.group(1)): entry.group(0) for entry in entries}
    missing = sorted({canonical(name) for name in names} - set(found))
    if missing:
        raise SystemExit(f"{lock.name} has no entry for {', '.join(missing)}")
    return "".join(found[canonical(name)] for name in names)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_kernels(folder: Path) -> None:
    """mamba-ssm from its locked sdist, without its CUDA extension (its Triton kernels are all
    the library uses), as scripts/kernels.sh installs it here."""
    env = dict(os.environ, MAMBA_SKIP_CUDA_BUILD="TRUE", MAMBA_FORCE_BUILD="TRUE")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--require-hashes",
                    "-r", str(ROOT / "requirements-kernels.lock"), "-w", str(folder)], check=True, env=env)


def retag_if_pure(wheel: Path) -> None:
    """A wheel built here is tagged for this interpreter (cp311): if it holds no compiled
    code, it is retagged py3-none-any, which the GPU's Python 3.12 installs."""
    import zipfile

    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import parse_wheel_filename

    platforms = [PLATFORM[i + 1] for i, option in enumerate(PLATFORM) if option == "--platform"]
    supported = {*cpython_tags((3, 12), platforms=platforms), *compatible_tags((3, 12), platforms=platforms)}
    if parse_wheel_filename(wheel.name)[3] & supported:
        return
    with zipfile.ZipFile(wheel) as archive:
        compiled = [name for name in archive.namelist() if name.endswith((".so", ".pyd"))]
    if compiled:
        raise SystemExit(f"{wheel.name} holds compiled code ({compiled[0]}) for another Python than 3.12")
    subprocess.run([sys.executable, "-m", "wheel", "tags", "--remove", "--python-tag", "py3", "--abi-tag", "none",
                    "--platform-tag", "any", str(wheel)], check=True)


def check_installable(folder: Path) -> None:
    """pip's own verdict that every wheel installs on the GPU's Python 3.12, and their size."""
    wheels = sorted(folder.glob("*.whl"))
    with tempfile.TemporaryDirectory() as target:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-index", "--no-deps",
                        "--target", target, *PLATFORM, *map(str, wheels)], check=True)
    total = sum(wheel.stat().st_size for wheel in wheels)
    if total > WHEELS_LIMIT_MIB * 2**20:
        raise SystemExit(f"the wheels take {total / 2**20:.1f} MiB, more than {WHEELS_LIMIT_MIB} MiB")
