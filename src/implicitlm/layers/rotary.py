"""Rotary position embedding (RoPE) in the rotate-half layout of Hugging Face Llama.

The rotated planes of a head are (i, i + head_dim / 2), not interleaved pairs: the layout
of transformers' Llama, so weights copied from ``LlamaForCausalLM`` give the same scores.
Angles are computed as transformers computes them (float32 inverse frequencies times
float32 positions), in float64 when the model runs in float64.
"""

from __future__ import annotations

import torch


def rotary_cos_sin(
    start: int, length: int, head_dim: int, theta: float, device=None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (length, head_dim) for positions start .. start + length - 1."""
    return rotary_cos_sin_at(torch.arange(start, start + length, device=device), head_dim, theta, dtype)


def rotary_cos_sin_at(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (*positions.shape, head_dim): per-sample positions (left padding)."""
    compute = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=compute) / head_dim))
    angles = positions.to(compute).unsqueeze(-1) * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape (..., length, head_dim) by the angles of ``rotary_cos_sin``."""
    return x * cos + rotate_half(x) * sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)
