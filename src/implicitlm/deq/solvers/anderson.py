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
# A learned step must cut the residual below this share of the one before it, or its sample
# falls back to the least-squares step: a mixing that stalls (damping near 0) is caught as
# surely as one that overshoots. The least-squares step cut it to about half per pass on the
# shipped WikiText-2 models.
SUFFICIENT_DECREASE = 0.9
REGULARISATION = 1e-6  # relative to max_i |g_i|^2, per sample
# A learned mixing of a step (a model's, ``models/learned_solver.py``): per sample, (normalised
# Gram matrix, history mask, least-squares weights, log residual fall), each newest entry
# first -> (the step's weights, summing to 1, and its damping).
Mixing = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def safeguarded_anderson(
    f: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    max_iter: int,
    memory: int = MEMORY,
    regularisation: float = REGULARISATION,
    mixing: Mixing | None = None,
    on_proposed: Callable[[torch.Tensor], None] | None = None,
    **unused,
) -> torch.Tensor:
    """``max_iter`` calls of ``f``, or fewer when ``f`` ends the loop (as the solve's
    tracker does once every sample is done); returns the last image f(x). It has no stop
    test of its own: stopping, per sample, is the caller's.

    ``mixing``: a learned correction of each step (``Mixing``), which a sample stops
    using once a learned step fails to cut its residual below ``SUFFICIENT_DECREASE`` times
    the one before. ``on_proposed(x)``: each mixed iterate, with the mixing's graph (what
    fitting the mixing reads); the next pass gets it detached."""
    shape = x0.shape
    x = x0.reshape(shape[0], -1)
    xs = x.new_zeros(shape[0], memory, x.shape[1])
    fs = torch.zeros_like(xs)
    history = torch.zeros(shape[0], dtype=torch.long, device=x.device)
    best = torch.full((shape[0],), float("inf"), dtype=x.dtype, device=x.device)
    fallen = torch.zeros(shape[0], dtype=torch.bool, device=x.device)
    fx, first, last = x, None, None
    for k in range(max_iter):
        fx = f(x.view(shape)).reshape_as(x)
        residual = (fx - x).norm(dim=1)
        rose = residual > best
        history = torch.where(rose, 0, history).add(1).clamp(max=memory)
        best = torch.minimum(best, residual)
        slot = k % memory
        xs[:, slot], fs[:, slot] = x, fx
        weights, gram, valid = _least_squares_weights(xs, fs, history, slot, regularisation)
        if mixing is None:
            x = torch.bmm(weights.unsqueeze(1), fs).squeeze(1)
            continue
        if first is None:
            first = residual.clamp_min(1e-30)
        else:  # this pass's point was a learned step's, where the sample had not fallen back
            fallen = fallen | ~(residual < SUFFICIENT_DECREASE * last)
        last = residual
        fall = torch.log(residual.clamp_min(1e-30) / first)  # finite for a frozen sample too (residual 0)
        x = _learned_step(mixing, xs, fs, (weights, gram, valid), slot, fall, fallen)
        if on_proposed is not None:
            on_proposed(x.view(shape))
        x = x.detach()
    return fx.view(shape)


def _least_squares_weights(xs: torch.Tensor, fs: torch.Tensor, history: torch.Tensor, slot: int,
                           regularisation: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights a summing to 1 over each sample's last ``history`` entries that minimise
    |sum_i a_i g_i|^2 + regularisation * max_i |g_i|^2 * |a|^2 (g_i = f(x_i) - x_i), with the
    Gram matrix of the g_i (float64) and the mask of the entries in the history, all in slot
    order."""
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
    # solve_ex: no check of the factorisation on the host (a sync per step on a GPU); the
    # regularised system is never singular.
    weights = torch.linalg.solve_ex(system, valid.double().unsqueeze(-1))[0].squeeze(-1)
    weights = (weights / weights.sum(dim=1, keepdim=True)).to(fs.dtype)
    return weights, gram, valid


def _learned_step(mixing: Mixing, xs: torch.Tensor, fs: torch.Tensor, least_squares, slot: int,
                  residual_fall: torch.Tensor, fallen: torch.Tensor) -> torch.Tensor:
    """sum_i a_i (b f(x_i) + (1 - b) x_i) with the mixing's weights a and damping b, or the
    least-squares weights and b = 1 where a sample has ``fallen`` back. The mixing reads
    its inputs newest first, whatever slot the newest entry is in."""
    weights, gram, valid = least_squares
    memory = xs.shape[1]
    # Scale-free: divided by the largest |g_i|^2 (>0 even for a frozen sample, whose g is 0).
    gram = (gram / gram.diagonal(dim1=1, dim2=2).amax(dim=1).clamp_min(1e-30)[:, None, None]).to(fs.dtype)
    # by_age[j]: the slot of age j; the map is its own inverse (slot s holds age (slot - s) % m),
    # so the same index puts the mixing's answer back in slot order.
    by_age = (slot - torch.arange(memory, device=xs.device)) % memory
    learned, damping = mixing(gram[:, by_age][:, :, by_age], valid[:, by_age], weights[:, by_age], residual_fall)
    learned = learned.index_select(1, by_age)
    weights = torch.where(fallen[:, None], weights, learned)
    damping = torch.where(fallen, torch.ones_like(damping), damping)[:, None]
    mixed_images = torch.bmm(weights.unsqueeze(1), fs).squeeze(1)
    mixed_iterates = torch.bmm(weights.unsqueeze(1), xs).squeeze(1)
    return damping * mixed_images + (1 - damping) * mixed_iterates
