"""Learned mixing for Anderson acceleration (Bai, Koltun and Kolter, *Neural Deep Equilibrium
Solvers*, ICLR 2022: the HyperAnderson half), with the safeguarded least-squares step as its
starting point and its fallback.

Anderson's next iterate is ``sum_i a_i (b f(x_i) + (1 - b) x_i)`` over the last few iterates,
with ``a`` the least-squares weights (``anderson._least_squares_weights``) and ``b = 1``. A
small network reads what the solve knows at that step, scale-free (the residuals' Gram
matrix divided by its largest entry, which entries are history, the least-squares weights
and how far the residual has fallen since the first evaluation), and proposes a correction
to the weights (summing to zero, so the weights still sum to one) and the damping ``b`` in
(0, 2). Its last layer starts at zero: an untrained mixing is safeguarded Anderson exactly.

The stop test is the solve's own, so the tolerance keeps its meaning; a sample whose
learned step fails to cut its residual by a tenth (``anderson.SUFFICIENT_DECREASE``) falls
back for the rest of its solve to the safeguarded step (least-squares weights, ``b = 1``): a
poor mixing costs a pass or two, never a solve that stops short.

Saved beside a checkpoint's weights as ``learned_mixing.safetensors`` and its digest; the
solver that uses it is ``learned_anderson``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .saved_network import load_network, save_network

MIXING_FILE = "learned_mixing.safetensors"
WIDTH = 64  # hidden units; the network reads a few dozen numbers per sample and step
MAX_DAMPING = 2.0  # b in (0, 2): from heavy damping to over-relaxation


class LearnedMixing(nn.Module):
    """(normalised Gram, history mask, least-squares weights, log residual fall) per sample,
    each in age order (0: the newest entry) -> (mixing weights summing to 1, damping), in
    the Gram matrix's dtype."""

    def __init__(self, memory: int, width: int = WIDTH) -> None:
        super().__init__()
        self.memory, self.width = memory, width
        features = memory * memory + 2 * memory + 1
        self.hidden = nn.Linear(features, width)
        self.out = nn.Linear(width, memory + 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, gram: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor,
                residual_fall: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # In the iterate's precision (at least float32), as the least-squares weights are: a
        # float64 solve keeps its digits, and a sample's step does not depend on its batch.
        dtype = gram.dtype
        mask = valid.to(dtype)
        features = torch.cat([gram.flatten(1), mask, weights, residual_fall[:, None].to(dtype)], dim=1)
        hidden = nn.functional.linear(features, self.hidden.weight.to(dtype), self.hidden.bias.to(dtype))
        out = nn.functional.linear(nn.functional.gelu(hidden), self.out.weight.to(dtype), self.out.bias.to(dtype))
        correction = out[:, : self.memory] * mask
        correction = correction - mask * correction.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True)
        # sigmoid(0) = 1/2: the untrained damping is exactly 1.
        return weights + correction, MAX_DAMPING * torch.sigmoid(out[:, self.memory])

    def save(self, folder: str | Path) -> None:
        """``MIXING_FILE`` and its digest in ``folder``."""
        save_network(self, folder, MIXING_FILE, {"memory": str(self.memory), "width": str(self.width)})

    @classmethod
    def load(cls, folder: str | Path, memory: int) -> LearnedMixing:
        """The mixing saved in ``folder`` for Anderson's history of ``memory`` entries; a
        missing, damaged or mismatched file is a one-line DataError."""
        def build(tensors: dict[str, torch.Tensor]) -> LearnedMixing:
            return cls(memory, tensors["hidden.weight"].shape[0] if "hidden.weight" in tensors else WIDTH)

        return load_network(folder, MIXING_FILE, build, "the config's fixed_point names solver 'learned_anderson'")
