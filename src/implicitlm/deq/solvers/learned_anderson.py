"""Learned Anderson, the solver "learned_anderson": safeguarded Anderson (``anderson``) whose
steps the checkpoint's learned mixing (``learned_mixing``, fitted by implicitlm solver train)
corrects."""

from __future__ import annotations

from typing import Callable

import torch

from ...core.errors import OptionError
from ..learned_mixing import LearnedMixing
from .anderson import safeguarded_anderson


def learned_anderson(f: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, max_iter: int,
                     learned_mixing: LearnedMixing | None = None, **options) -> torch.Tensor:
    """Safeguarded Anderson with ``learned_mixing``. Without one, refused here, at the first
    solve, not when the solver is chosen: a model is built before its mixing is loaded."""
    if learned_mixing is None:
        raise OptionError("solver 'learned_anderson', but this model has no learned mixing (implicitlm solver train "
                          "makes one)", arguments=("solver",))
    return safeguarded_anderson(f, x0, max_iter, mixing=learned_mixing, **options)
