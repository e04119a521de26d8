"""The SSD scan on CUDA through mamba_ssm's fused Triton kernels, when that package is installed.

The pure-PyTorch ``ssd.ssd_chunked`` is both the fallback and the oracle the kernel is
tested against. The kernel takes dt already softplus'd (``dt_softplus=False``), the
same (b, l, h, p) / (b, l, g, n) layouts and the same (b, h, p, n) states, so it is a
drop-in replacement, gradients included.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch

from .ssm_parameters import ssm_state_dtype

_notified = False


@functools.cache
def fused_ssd_kernel() -> Callable | None:
    """mamba_ssm's ``mamba_chunk_scan_combined``, or None when it cannot be imported."""
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except (ImportError, OSError):
        # OSError: an installed mamba_ssm whose compiled extension does not load.
        return None
    return mamba_chunk_scan_combined


def run_fused_ssd(
    kernel: Callable, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    chunk_size: int, initial_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    return y, final_state.to(ssm_state_dtype(x.dtype))


def notify_fallback_once(reason: str) -> None:
    """One warning per process, not one per layer and iteration."""
    global _notified
    if not _notified:
        _notified = True
        warnings.warn(f"implicitlm: {reason}; running the pure-PyTorch path", stacklevel=3)
