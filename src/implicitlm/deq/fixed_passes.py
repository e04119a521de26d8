"""A solve of exactly K passes: test-time compute as a budget of evaluations, not a tolerance.

With ``passes=K`` an inference solve is plain iteration z <- f(z), K times, from the start
the options say (the learned guess or z = 0, whose first pass is f(0)). Nothing is checked
between passes: no residual, no tolerance, no divergence watch, no frozen rows, no host
sync; per token at batch 1 that bookkeeping cost as much as the pass itself. The state a
recurrence carries on is the last pass's, the one that gave the answer.

The stats still say how far from a fixed point the answer is: the residual of the last step,
``|z_K - z_(K-1)|`` (relative to ``|z_K|`` in "rel" stop mode), read off the last two
iterates once the solve is done, with no further evaluation. A fixed budget holds no
tolerance, so reports give that residual for what it is (``ConvergenceTally.in_passes``), never
a share "not converged": nothing is retried, nothing raises for it and no warning is logged
(a non-finite answer is still counted as one).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .options import FixedPointOptions
from .solver import computed_dtype, held_tolerance
from .stats import FixedPointStats

# z -> (f(z), the state its pass reached).
StateMapFn = Callable[[torch.Tensor], tuple[torch.Tensor, Any]]
# (z_t, u_t, the state before token t) -> (token t's image, the state its pass reached).
StepFn = Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Any]]
# (t, the previous token's answer or None, the state before token t) -> token t's first iterate.
GuessFn = Callable[[int, "torch.Tensor | None", Any], torch.Tensor]


@torch.no_grad()
def solve_in_passes(
    f: StateMapFn, z0: torch.Tensor, passes: int, tol: float, options: FixedPointOptions, mode: str = "simultaneous",
) -> tuple[torch.Tensor, FixedPointStats, Any]:
    """(z_K, stats, the state of the K-th pass) of ``passes`` evaluations of ``f`` from ``z0``;
    the stats are per sample, the residual over the whole of each sample's iterate."""
    before, (z, state) = _iterate(f, z0, passes)
    return z, pass_stats(z.flatten(1), before.flatten(1), passes, tol, options, mode), state


@torch.no_grad()
def sequence_in_passes(
    step: StepFn, injection: torch.Tensor, state: Any, hidden_size: int, passes: int, tol: float,
    options: FixedPointOptions, initial_guess: GuessFn | None = None,
) -> tuple[torch.Tensor, Any, FixedPointStats]:
    """Sequential mode in ``passes`` per token: tokens ``injection[:, t]`` one by one, each from
    the state the previous token's last pass left; returns (z of shape (B, L, D), state,
    stats of shape (B, L)). ``initial_guess``: as ``solve_sequence`` takes it (None: z = 0)."""
    batch, length = injection.shape[:2]
    answers, befores = [], []
    zeros = injection.new_zeros(batch, hidden_size)
    for t in range(length):
        u_t = injection[:, t]
        z0 = zeros if initial_guess is None else initial_guess(t, answers[-1] if answers else None, state)
        before, (z_t, state) = _iterate(lambda z, u_t=u_t, state=state: step(z, u_t, state), z0, passes)
        answers.append(z_t)
        befores.append(before)
    z, before = torch.stack(answers, dim=1), torch.stack(befores, dim=1)
    return z, state, pass_stats(z, before, passes, tol, options, "sequential")


def _iterate(f: StateMapFn, z0: torch.Tensor, passes: int) -> tuple[torch.Tensor, tuple[torch.Tensor, Any]]:
    """(z_(K-1), (z_K, the K-th pass's state)): the last two iterates, the last pass's state."""
    before, image = z0, f(z0)
    for _ in range(passes - 1):
        before, image = image[0], f(image[0])
    return before, image


def pass_stats(
    z: torch.Tensor, before: torch.Tensor, passes: int, tol: float, options: FixedPointOptions, mode: str,
) -> FixedPointStats:
    """The stats of fixed-pass solves whose answers are ``z`` and whose iterates before the last
    pass were ``before``, each answer a vector along the last dimension (a sample's whole
    sequence flattened, or a token's): its last step's residual, ``passes`` iterations each."""
    norm_dtype = torch.promote_types(z.dtype, torch.float32)
    abs_residual = torch.linalg.vector_norm(z - before, dim=-1, dtype=norm_dtype)
    rel_residual = abs_residual / (torch.linalg.vector_norm(z, dim=-1, dtype=norm_dtype) + 1e-9)
    shape = abs_residual.shape
    return FixedPointStats(
        iterations=torch.full(shape, passes, dtype=torch.long, device=z.device),
        abs_residual=abs_residual,
        rel_residual=rel_residual,
        diverged=torch.zeros(shape, dtype=torch.bool, device=z.device),
        non_finite=~torch.isfinite(abs_residual),
        evaluations=passes * (shape[1] if len(shape) > 1 else 1),
        row_evaluations=passes * abs_residual.numel(),
        tol=held_tolerance(tol, computed_dtype(z)),
        stop_mode=options.stop_mode,
        solver=options.described_solver(mode, passes),
        passes=passes,
    )
