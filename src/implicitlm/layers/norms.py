"""RMSNorm and the gated RMSNorm of the Mamba2 mixer."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        # At least float32 for the mean of squares, without demoting float64.
        x = x.to(torch.promote_types(dtype, torch.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class GatedRMSNorm(RMSNorm):
    """RMSNorm(y * silu(gate)): Mamba2 gates before normalising (``norm_before_gate=False``).

    With ``group_size`` smaller than the width, each group of channels is normalised on its
    own, as mamba_ssm and transformers do for ``n_groups > 1``.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None) -> None:
        super().__init__(hidden_size, eps)
        self.group_size = group_size or hidden_size
        if hidden_size % self.group_size:
            raise ValueError(f"hidden size {hidden_size} is not a multiple of the group size {self.group_size}")

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        gated = x * nn.functional.silu(gate.to(x.dtype))
        dtype = gated.dtype
        grouped = gated.to(torch.promote_types(dtype, torch.float32)).unflatten(-1, (-1, self.group_size))
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * grouped.flatten(-2).to(dtype)
