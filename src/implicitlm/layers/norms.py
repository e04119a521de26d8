"""RMSNorm and the gated RMSNorm of the Mamba2 mixer."""

from __future__ import annotations

import torch
from torch import nn

from ..core.errors import OptionError


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dimension, in the dtype of x."""
    # At least float32 for the mean of squares, without demoting float64.
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_normalize(x, self.eps)


class GatedRMSNorm(RMSNorm):
    """RMSNorm(y * silu(gate)): Mamba2 gates before normalising (``norm_before_gate=False``).

    With ``group_size`` smaller than the width, each group of channels is normalised on its
    own, as mamba_ssm and transformers do for ``n_groups > 1``.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None) -> None:
        super().__init__(hidden_size, eps)
        self.group_size = group_size or hidden_size
        if hidden_size % self.group_size:
            raise OptionError(f"hidden size {hidden_size} is not a multiple of the group size {self.group_size}")

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        gated = x * nn.functional.silu(gate.to(x.dtype))
        grouped = gated.unflatten(-1, (-1, self.group_size))
        return self.weight * rms_normalize(grouped, self.eps).flatten(-2)
