"""RMSNorm and the gated RMSNorm of the Mamba2 mixer."""

from __future__ import annotations

import torch
from torch import nn


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
            raise ValueError(f"hidden size {hidden_size} is not a multiple of the group size {self.group_size}")

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _GatedRMSNormFunction.apply(x, gate.to(x.dtype), self.weight, self.group_size, self.eps)[0]


class _GatedRMSNormFunction(torch.autograd.Function):
    """weight * rms_normalize(x * silu(gate)) per group, with a hand-written backward.

    Autograd would keep and replay some ten full-size intermediates of this chain; this
    keeps x, gate and one scale per group, and recomputes the rest in a few fused steps.
    """

    generate_vmap_rule = True  # torch.func (the Jacobian analysis) differentiates the step form

    @staticmethod
    def forward(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
        wide = torch.promote_types(x.dtype, torch.float32)
        grouped = (x * nn.functional.silu(gate)).unflatten(-1, (-1, group_size)).to(wide)
        inv_rms = torch.rsqrt(grouped.square().mean(-1, keepdim=True) + eps)
        # The scale is an output too, so that the backward pass need not recompute it.
        return weight * (grouped * inv_rms).to(x.dtype).flatten(-2), inv_rms

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, gate, weight, group_size, _ = inputs
        inv_rms = output[1]
        ctx.mark_non_differentiable(inv_rms)
        ctx.save_for_backward(x, gate, weight, inv_rms)
        ctx.group_size = group_size

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor, _grad_inv_rms: torch.Tensor):
        x, gate, weight, inv_rms = ctx.saved_tensors
        wide, group_size = inv_rms.dtype, ctx.group_size
        sigmoid = torch.sigmoid(gate.to(wide))
        silu = gate.to(wide) * sigmoid
        normalized = (x.to(wide) * silu).unflatten(-1, (-1, group_size)) * inv_rms
        grad_normalized = (grad_output.to(wide) * weight).unflatten(-1, (-1, group_size))
        # d/dg of g / rms(g): remove the component along the normalised vector, then rescale.
        along = (grad_normalized * normalized).mean(-1, keepdim=True)
        grad_gated = ((grad_normalized - normalized * along) * inv_rms).flatten(-2)
        grad_x = grad_gated * silu
        grad_gate = grad_gated * x * sigmoid * (1 + gate * (1 - sigmoid))
        grad_weight = (grad_output.to(wide) * normalized.flatten(-2)).flatten(0, -2).sum(0)
        return grad_x.to(x.dtype), grad_gate.to(gate.dtype), grad_weight.to(weight.dtype), None, None
