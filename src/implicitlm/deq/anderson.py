"""Safeguarded Anderson acceleration, per sample, with a scale-free regularisation.

torchdeq's ``anderson`` regularises its least-squares system with an absolute 1e-4: once
the residuals ``g = f(x) - x`` are small (rel 1e-4 of a unit-RMS state is ~1e-3 per
token), ``g g^T`` is far below 1e-4, the weights flatten to a plain average of the
history and the iteration crawls, slower than no acceleration at all. Here the
regularisation is relative to each sample's own largest ``|g_i|^2``, so the method
behaves the same at every scale.

The safeguard: a sample whose residual rises above its best so far drops its history and
restarts from a plain step. Far from the fixed point the map of a trained model can be
too nonlinear for any secant model (the linear extrapolation lands somewhere worse);
restarting there keeps the method close to plain iteration until the iterates come near
enough for acceleration to pay.

Every operation is per sample (batched matrix products and solves), so a sample's
iterates never depend on the rest of the batch.
"""

from __future__ import annotations

from typing import Callable

import torch

MEMORY = 5  # history length m: the usual choice for DEQs, and beyond it gains were nil here
REGULARISATION = 1e-6  # relative to max_i |g_i|^2, per sample


def safeguarded_anderson(
    f: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    max_iter: int,
    memory: int = MEMORY,
    regularisation: float = REGULARISATION,
    **unused,
) -> torch.Tensor:
    """``max_iter`` calls of ``f``, or fewer when ``f`` ends the loop (as the solve's
    tracker does once every sample is done); returns the last image f(x). It has no stop
    test of its own: stopping, per sample, is the caller's."""
    shape = x0.shape
    x = x0.reshape(shape[0], -1)
    xs = x.new_zeros(shape[0], memory, x.shape[1])
    fs = torch.zeros_like(xs)
    history = torch.zeros(shape[0], dtype=torch.long, device=x.device)
    best = torch.full((shape[0],), float("inf"), dtype=x.dtype, device=x.device)
    fx = x
    for k in range(max_iter):
        fx = f(x.view(shape)).reshape_as(x)
        residual = (fx - x).norm(dim=1)
        history = torch.where(residual > best, 0, history).add(1).clamp(max=memory)
        best = torch.minimum(best, residual)
        slot = k % memory
        xs[:, slot], fs[:, slot] = x, fx
        x = _mix(xs, fs, history, slot, regularisation)
    return fx.view(shape)


def _mix(xs: torch.Tensor, fs: torch.Tensor, history: torch.Tensor, slot: int, regularisation: float) -> torch.Tensor:
    """sum_i a_i f(x_i) over each sample's last ``history`` entries, with weights a summing
    to 1 that minimise |sum_i a_i g_i|^2 + regularisation * max_i |g_i|^2 * |a|^2."""
    memory = xs.shape[1]
    age = (slot - torch.arange(memory, device=xs.device)) % memory  # 0: the newest entry
    valid = age[None, :] < history[:, None]
    g = fs - xs
    # The small (m x m) system in float64: g g^T squares the conditioning of g.
    gram = torch.bmm(g, g.transpose(1, 2)).double() * (valid[:, :, None] & valid[:, None, :])
    scale = gram.diagonal(dim1=1, dim2=2).amax(dim=1).clamp_min(1e-30)  # >0 for a frozen sample, g = 0
    eye = torch.eye(memory, dtype=gram.dtype, device=gram.device)
    # Entries outside the history get a unit diagonal and a zero right-hand side: weight 0.
    system = gram + regularisation * scale[:, None, None] * eye + (~valid)[:, :, None] * eye
    weights = torch.linalg.solve(system, valid.double().unsqueeze(-1))
    weights = (weights / weights.sum(dim=1, keepdim=True)).to(fs.dtype)
    return torch.bmm(weights.transpose(1, 2), fs).squeeze(1)
