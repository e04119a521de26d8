"""Plain fixed-point iteration, the solver "fixed_point_iter"."""

from __future__ import annotations

from typing import Callable

import torch


def plain_iteration(f: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, max_iter: int,
                    **unused) -> torch.Tensor:
    """z <- f(z), ``max_iter`` times or until ``f`` (the solve's tracker) ends the loop.

    The same iterates as torchdeq's ``fixed_point_iter``, without its own residual norms
    and lowest-iterate copies at every step: the tracker already keeps both, per sample.
    """
    z = x0
    for _ in range(max_iter):
        z = f(z)
    return z
