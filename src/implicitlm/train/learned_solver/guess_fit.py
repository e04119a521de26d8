"""Fitting a learned initial guess (``models.learned_solver.InitialGuess``) to a frozen model's
fixed points, one batch's tight solve at a time (``fit``).

The guess gets ``UPDATES_PER_BATCH`` updates on each token's distance to its fixed point
relative to the fixed point's norm (the initial-guess loss of Bai, Koltun and Kolter's *Neural
Deep Equilibrium Solvers*); half the tokens see the previous token's fixed point, half a zero
vector in its place, since a simultaneous solve does not know it yet and a sequential one does.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...models.learned_solver import InitialGuess
from .progress import FitState

# Updates of the guess per batch solved: a tight solve costs a dozen passes of the model, an
# update of the guess a small fraction of one.
UPDATES_PER_BATCH = 8


def fit_guess(guess: InitialGuess, optimizer, embedded: torch.Tensor, z_star: torch.Tensor, reader, state: FitState,
              settings: dict[str, Any]) -> None:
    """``reader``: the batch's ``state_reader`` for a guess that reads the state (else None);
    a token whose previous fixed point is hidden has its state hidden too, as in a
    simultaneous solve."""
    previous = torch.cat([torch.zeros_like(z_star[:, :1]), z_star[:, :-1]], dim=1)
    for _ in range(UPDATES_PER_BATCH):
        update = len(state.losses["guess"])
        draw = torch.Generator().manual_seed(settings["seed"] * 1_000_003 + update)
        known = (torch.rand(z_star.shape[:2], generator=draw) < 0.5).to(z_star.device)
        decay(optimizer, settings["lr"], update, settings["steps"] * UPDATES_PER_BATCH)
        shown = known.unsqueeze(-1)
        read = None if reader is None else (lambda queries: [read * shown for read in reader(queries)])
        loss = relative_distance(guess(embedded, previous * shown, read), z_star).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        state.losses["guess"].append(loss.item())


def decay(optimizer, lr: float, update: int, updates: int) -> None:
    """Each learning rate cosine-decayed from ``lr`` over ``updates``, at ``update``."""
    for group in optimizer.param_groups:
        group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * update / updates))


def relative_distance(iterate: torch.Tensor, z_star: torch.Tensor) -> torch.Tensor:
    """Each token's distance to its fixed point over the fixed point's norm."""
    return (iterate.float() - z_star.float()).norm(dim=-1) / (z_star.float().norm(dim=-1) + 1e-6)
