"""mamba_ssm's fused SSD kernels run on a CPU by Triton's interpreter: test support only.

Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest before anything imports
triton) executes the same kernels in NumPy, so the CUDA path of ``ssd_scan`` can be
exercised where no GPU is. What a CPU lacks is shimmed here, never in the library:

- ``import mamba_ssm`` fails without its compiled CUDA extension (its ``__init__`` imports
  ``selective_scan_cuda``); the Triton submodules need none of it, so the package is
  registered without running its ``__init__``;
- the kernels enter ``torch.cuda.device(index)`` and size the backward's grid by
  ``torch.cuda.get_device_properties(...).multi_processor_count``;
- the autotuner benchmarks its configurations on a GPU ("0 active drivers" on a CPU), so
  each kernel keeps one, as ``IMPLICITLM_KERNEL_TUNING=smallest`` makes it do on a GPU: the
  library's ``keep_smallest_configurations`` (undone with the modules on exit).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import types
from typing import Callable, Iterator

import torch

# What the backward sizes its grid by: an H100's count, any positive number runs the same sums.
MULTIPROCESSORS = 132


def kernel_packages_missing() -> str | None:
    """Why the interpreted kernel cannot run here (None: it can)."""
    for name in ("triton", "mamba_ssm", "einops"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed (pip install 'implicitlm[gpu-check]', see scripts/setup.sh)"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "TRITON_INTERPRET=1 is not set (conftest sets it where no GPU is)"
    return None


class FusedKernel:
    """The interpreted kernel as ``ssd_scan``'s dispatch finds it: ``calls`` records the
    input shape of every call; ``replace(fn)`` makes the dispatch find ``fn(kernel, ...)``
    instead (to check that a wrong convention is caught)."""

    def __init__(self, module: types.ModuleType, monkeypatch) -> None:
        self.kernel = module.mamba_chunk_scan_combined
        self.calls: list[torch.Size] = []
        self._module, self._monkeypatch = module, monkeypatch
        self.replace(lambda kernel, *args, **kwargs: kernel(*args, **kwargs))

    def replace(self, fn: Callable) -> None:
        from implicitlm.layers import ssd_kernel

        def dispatched(*args, **kwargs):
            self.calls.append(args[0].shape)
            return fn(self.kernel, *args, **kwargs)

        self._monkeypatch.setattr(self._module, "mamba_chunk_scan_combined", dispatched)
        ssd_kernel.fused_ssd_kernel.cache_clear()  # found afresh by the real import


@contextlib.contextmanager
def interpreted_fused_kernel(monkeypatch) -> Iterator[FusedKernel]:
    """Inside: ``ssd_scan`` on CPU tensors dispatches, through the library's own
    ``fused_ssd_kernel()`` import, to mamba_ssm's fused kernel run by Triton's interpreter.
    Undone (modules and patches) on exit."""
    from implicitlm.layers import ssd, ssd_kernel

    before = set(sys.modules)
    package = types.ModuleType("mamba_ssm")
    package.__path__ = list(importlib.util.find_spec("mamba_ssm").submodule_search_locations)
    monkeypatch.setitem(sys.modules, "mamba_ssm", package)
    combined = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
    ssd_kernel.keep_smallest_configurations()
    monkeypatch.setattr(torch.cuda, "device", lambda index=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(multi_processor_count=MULTIPROCESSORS))
    monkeypatch.setattr(ssd, "KERNEL_DEVICES", (*ssd.KERNEL_DEVICES, "cpu"))
    try:
        yield FusedKernel(combined, monkeypatch)
    finally:
        ssd_kernel.fused_ssd_kernel.cache_clear()
        for name in set(sys.modules) - before:
            if name.startswith("mamba_ssm"):
                del sys.modules[name]

