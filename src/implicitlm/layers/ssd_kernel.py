"""The SSD scan on CUDA through mamba_ssm's fused Triton kernels, when that package is installed.

The pure-PyTorch ``ssd.ssd_chunked`` is both the fallback and the oracle the kernel is
tested against. The kernel takes dt already softplus'd (``dt_softplus=False``), the
same (b, l, h, p) / (b, l, g, n) layouts and the same (b, h, p, n) states, so it is a
drop-in replacement, gradients included.

What the kernels cost before their first result, paid once rather than per process and
length: Triton benchmarks every configuration of a kernel (about a minute for the SSD's
kernels on an H100) for each new chunk size, head and state size and dtype, and compiles a
variant for each new length's divisibility. Its cache folder (``TRITON_CACHE_DIR``, by
default ``~/.triton/cache``) keeps the compiled kernels across processes, and with
``TRITON_CACHE_AUTOTUNING=1``, which ``fused_ssd_kernel`` sets unless the user set it, the
benchmarks' results as well; sequences are padded to whole chunks (``pad_to_chunks``), so
every length runs one compiled variant. Where a minute per shape is too dear (a test run
over many small models, a first look on a fresh machine), ``IMPLICITLM_KERNEL_TUNING=smallest``
skips the benchmarks: each kernel keeps the one configuration with the smallest tiles, which
fits any GPU's shared memory, and a new shape costs only its compilation (seconds), at some
speed.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from ..core.errors import OptionError
from .ssm_parameters import ssm_state_dtype

_notified = False
# Triton's own switch (triton >= 3.4): autotuning results kept in its cache folder. Read as
# each autotuned kernel is defined, so it is set before mamba_ssm's kernels are imported.
KEEP_AUTOTUNING = "TRITON_CACHE_AUTOTUNING"
# Which configuration each kernel runs: "tuned", Triton's pick among mamba_ssm's, benchmarked
# once per shape and dtype; "smallest", the one with the smallest tiles, not benchmarked.
KERNEL_TUNING = "IMPLICITLM_KERNEL_TUNING"
KERNEL_TUNINGS = ("tuned", "smallest")


@functools.cache
def fused_ssd_kernel() -> Callable | None:
    """mamba_ssm's ``mamba_chunk_scan_combined``, or None when it cannot be imported; imported
    with Triton keeping its autotuning results across processes (``KEEP_AUTOTUNING``) unless the
    environment says otherwise, each kernel held to its smallest configuration where
    ``KERNEL_TUNING`` says ``smallest``."""
    tuning = kernel_tuning()
    os.environ.setdefault(KEEP_AUTOTUNING, "1")
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except (ImportError, OSError):
        # OSError: an installed mamba_ssm whose compiled extension does not load.
        return None
    if tuning == "smallest":
        keep_smallest_configurations()
    return mamba_chunk_scan_combined


def kernel_tuning() -> str:
    """``KERNEL_TUNING``'s value, "tuned" when unset; anything else is refused."""
    tuning = os.environ.get(KERNEL_TUNING, "tuned")
    if tuning not in KERNEL_TUNINGS:
        raise OptionError(f"{KERNEL_TUNING}={tuning!r} is not one of {', '.join(KERNEL_TUNINGS)}")
    return tuning


def keep_smallest_configurations() -> None:
    """Every autotuned kernel of mamba_ssm's imported Triton modules keeps only its configuration
    of least ``tile_cost``. Triton's autotuner runs a lone configuration without benchmarking."""
    from triton.runtime.autotuner import Autotuner

    for name, module in list(sys.modules.items()):
        if name.startswith("mamba_ssm.ops.triton.") and module is not None:
            for kernel in vars(module).values():
                if isinstance(kernel, Autotuner) and len(kernel.configs) > 1:
                    kernel.configs = [min(kernel.configs, key=tile_cost)]


def tile_cost(config) -> int:
    """The shared memory a Triton configuration asks for, up to a constant: its block sizes'
    product (the elements of a tile) times its pipeline stages (the tiles in flight). The
    largest of the SSD's configurations asks 289 KiB, more than an H200's 227."""
    tile = math.prod(value for key, value in config.kwargs.items() if key.startswith("BLOCK_SIZE_"))
    return tile * (config.num_stages or 1)


def run_fused_ssd(
    kernel: Callable, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    chunk_size: int, initial_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    length = x.shape[1]
    x, dt, B, C = pad_to_chunks(chunk_size, x, dt, B, C)
    y, final_state = kernel(
        x.contiguous(),
        dt.contiguous(),
        A.float(),
        B.contiguous(),
        C.contiguous(),
        chunk_size,
        initial_states=None if initial_state is None else initial_state.contiguous(),
        return_final_states=True,
    )
    # The state in ``ssm_state_dtype``, as the pure scan gives it: the kernel's state passing
    # accumulates in float32 too, so this is no rounding of a half-precision state.
    return y[:, :length], final_state.to(ssm_state_dtype(x.dtype))


def pad_to_chunks(chunk_size: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The scan's (b, l, ...) inputs x, dt, B, C zero-padded at the end of l to whole chunks.

    Exact: a padded token has dt = 0, so its step exp(dt A) state + dt x B^T leaves the state
    as it was, and the state after the last real token is the final one; the outputs before
    it are causal, untouched by what follows. The caller drops the padded outputs."""
    pad = (-tensors[0].shape[1]) % chunk_size
    if not pad:
        return tensors
    return tuple(F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in tensors)


def notify_fallback_once(reason: str) -> None:
    """One warning per process, not one per layer and iteration."""
    global _notified
    if not _notified:
        _notified = True
        warnings.warn(f"implicitlm: {reason}; running the pure-PyTorch path", stacklevel=3)
