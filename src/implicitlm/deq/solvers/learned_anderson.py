"""Learned Anderson, the solver "learned_anderson": safeguarded Anderson (``anderson``) whose
steps the model's learned mixing (``models/learned_solver.py``, fitted by implicitlm solver
train) corrects. The table records it as needing that mixing, and safeguarded Anderson as what
solves in its place without one (``register_solver``'s ``without_mixing``)."""

from __future__ import annotations

from typing import Callable

import torch

from .anderson import Mixing, safeguarded_anderson


def learned_anderson(f: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, max_iter: int,
                     learned_mixing: Mixing, **options) -> torch.Tensor:
    """Safeguarded Anderson with ``learned_mixing``."""
    return safeguarded_anderson(f, x0, max_iter, mixing=learned_mixing, **options)
