"""The GPU check's setup step: the wheels installed (GPU machine), then the versions that run,
whether the library finds mamba_ssm's fused kernel, and what the environment misses of the
library's requirements.

It imports torch and the library's layers only after the install: the wheels replace what the
image holds at versions outside the library's ranges.
"""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

from gpu_check_shared import ROOT, SITE, WHEELS, report_figures
from gpu_check_wheels import canonical
from packaging.requirements import Requirement


def run(rehearse: bool, limit_s: float) -> None:
    """Install the wheels (GPU machine), then the versions that run and whether the library
    finds mamba_ssm's fused kernel."""
    figures: dict[str, Any] = {}
    if not rehearse:
        figures["wheels"] = install_wheels()
    report_figures(figures | environment())


def install_wheels() -> int:
    wheels = sorted(WHEELS.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {WHEELS}: run `bash scripts/gpu-check.sh --prepare` where there is a network")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(SITE), *map(str, wheels)], check=True)
    without_cuda_extension_import(SITE / "mamba_ssm" / "__init__.py")
    importlib.invalidate_caches()
    return len(wheels)


def without_cuda_extension_import(init: Path) -> None:
    """mamba_ssm's ``__init__`` imports its compiled CUDA extension (selective_scan_cuda),
    which a wheel built with MAMBA_SKIP_CUDA_BUILD lacks, so ``import mamba_ssm`` fails and
    the library would fall back to the pure scan everywhere. Only its Triton kernels are
    used: the installed ``__init__`` keeps its version and nothing else."""
    version = [line for line in init.read_text().splitlines() if line.startswith("__version__")]
    note = "# Emptied by benchmarks/gpu_check_setup.py: see without_cuda_extension_import."
    init.write_text("\n".join([note, *version]) + "\n")


def environment() -> dict[str, Any]:
    import torch
    from implicitlm.layers.ssd_kernel import fused_ssd_kernel

    names = ["torch", "triton", "transformers", "tokenizers", "huggingface-hub", "accelerate", "safetensors",
             "datasets", "pyarrow", "torchdeq", "mamba-ssm", "einops", "numpy"]
    versions = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    figures: dict[str, Any] = {"python": sys.version.split()[0], "versions": [f"{k} {v}" for k, v in versions.items()]}
    if torch.cuda.is_available():
        figures["gpu"] = torch.cuda.get_device_name()
    figures["library finds the fused kernel"] = fused_ssd_kernel() is not None
    wrong = unmet(declared_dependencies() + travelling_requirements())
    if wrong:
        figures["unmet requirements"] = wrong
    return figures


def declared_dependencies() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["dependencies"]


def travelling_requirements() -> list[str]:
    """What the installed wheels require of the image (pip installed them without it).
    mamba-ssm's are left out: only its Triton kernels run, which need none of them."""
    wheels = [dist for dist in metadata.distributions(path=[str(SITE)]) if canonical(dist.metadata["Name"]) != "mamba-ssm"]
    return [requirement for dist in wheels for requirement in dist.requires or []]


def unmet(requirements: list[str]) -> list[str]:
    """The requirements (pip's syntax) that this environment misses or holds at a version outside them."""
    wrong = set()
    for requirement in map(Requirement, requirements):
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            wrong.add(f"{requirement.name} missing")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            wrong.add(f"{requirement.name} {version}, not {requirement.specifier}")
    return sorted(wrong)
