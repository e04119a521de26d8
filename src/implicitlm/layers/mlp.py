"""SwiGLU MLP of Llama blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def swiglu_hidden_size(hidden_size: int) -> int:
    """floor(2 * 4d / 3): the 4d of a two-matrix MLP, shrunk by 2/3 so that three matrices
    hold the same number of parameters (d = 768 -> 2048)."""
    return 8 * hidden_size // 3


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), no biases; names as in transformers' LlamaMLP."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
