"""A solve of exactly K passes, the one loop of a fixed number of passes: test-time compute as
a budget of passes (without gradients), or training's unroll (with autograd through every
pass).

Without gradients it is plain iteration z <- f(z), K times, from the start the caller gives
(the learned guess or z = 0, whose first pass is f(0)). Nothing is checked between passes: no
residual, no tolerance, no divergence watch, no frozen rows, no host sync; per token at batch 1
that bookkeeping cost as much as the pass itself. The state a recurrence carries on is the last
pass's, the one that gave the answer.

The stats still say how far from a fixed point the answer is: the residual of the last step,
``|z_K - z_(K-1)|`` (relative to ``|z_K|`` in "rel" stop mode), read off the last two iterates
once the solve is done, with no further pass. A fixed budget holds no tolerance, so
reports give that residual for what it is (``ConvergenceTally.in_passes``), never a share "not
converged": nothing is retried, nothing raises for it and no warning is logged (a non-finite
answer is still counted as one).
"""

from __future__ import annotations

import torch

from .budget import Budget
from .residuals import computed_dtype, held_tolerance, row_norms
from .row_tracker import FixedPointFn, ImprovedFn
from .stats import FixedPointStats


def solve_in_passes(
    f: FixedPointFn, z0: torch.Tensor, budget: Budget, stop_mode: str, described: str,
    on_improved: ImprovedFn | None = None,
) -> tuple[torch.Tensor, FixedPointStats]:
    """(z_K, stats) of ``budget.passes`` passes of ``f`` from ``z0``, differentiated through
    for an unrolled budget (where autograd is on), without gradients otherwise. ``described``:
    what the stats call the solve. ``on_improved(None, None)`` once at the end, the last pass
    being every sample's answer (``KeptState`` keeps that pass's state). 0 passes: ``z0`` itself,
    whose residual is unknown (NaN)."""
    before, z = z0, z0
    with torch.set_grad_enabled(budget.kind == "unrolled" and torch.is_grad_enabled()):
        for _ in range(budget.passes):
            before, z = z, f(z)
    if on_improved is not None:
        on_improved(None, None)
    with torch.no_grad():
        if budget.passes:
            abs_residual = row_norms(z - before)
            rel_residual = abs_residual / (row_norms(z) + 1e-9)
            non_finite = ~torch.isfinite(abs_residual)
        else:
            abs_residual = rel_residual = torch.full((z0.shape[0],), float("nan"), device=z0.device)
            non_finite = torch.zeros(z0.shape[0], dtype=torch.bool, device=z0.device)
    return z, FixedPointStats(
        passes=torch.full((z0.shape[0],), budget.passes, dtype=torch.long, device=z0.device),
        abs_residual=abs_residual,
        rel_residual=rel_residual,
        diverged=torch.zeros(z0.shape[0], dtype=torch.bool, device=z0.device),
        non_finite=non_finite,
        batch_passes=budget.passes,
        row_passes=budget.passes * z0.shape[0],
        tol=held_tolerance(budget.tol, computed_dtype(z0)),
        stop_mode=stop_mode,
        solver=described,
        fixed_passes=budget.passes if budget.kind == "passes" else 0,
    )
