"""Sequential (RNN) mode: one fixed point per token, the recurrent state read-only while solving.

For token t the solver iterates ``z_t <- step(z_t, u_t, state_{t-1})`` where ``step``
returns a candidate next state that is thrown away; once z_t has converged, one more
``step`` commits the state that token t + 1 reads. The stop test is the solver's own,
per sample, so a sample's answer never depends on what else is in the batch.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .solver import FixedPointSolver
from .stats import FixedPointStats

StepFn = Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Any]]


def solve_sequence(
    step: StepFn,
    injection: torch.Tensor,
    state: Any,
    solver: FixedPointSolver,
    hidden_size: int,
    max_iter: int,
    tol: float,
) -> tuple[torch.Tensor, Any, FixedPointStats]:
    """Run tokens ``injection[:, t]`` one by one; returns (z of shape (B, L, D), state, stats).

    ``stats`` fields have shape (B, L): iterations and residuals of every token's solve.
    """
    batch, length = injection.shape[:2]
    outputs, iterations, abs_res, rel_res = [], [], [], []
    evaluations = 0
    for t in range(length):
        u_t = injection[:, t]

        def token_map(z: torch.Tensor, u_t: torch.Tensor = u_t) -> torch.Tensor:
            return step(z, u_t, state)[0]

        z0 = injection.new_zeros(batch, hidden_size)
        z_t, stats = solver.solve(token_map, z0, max_iter, tol)
        z_t, state = step(z_t, u_t, state)
        outputs.append(z_t)
        iterations.append(stats.iterations)
        abs_res.append(stats.abs_residual)
        rel_res.append(stats.rel_residual)
        evaluations += stats.evaluations + 1
    return torch.stack(outputs, dim=1), state, FixedPointStats(
        iterations=torch.stack(iterations, dim=1),
        abs_residual=torch.stack(abs_res, dim=1),
        rel_residual=torch.stack(rel_res, dim=1),
        evaluations=evaluations,
        tol=tol,
        stop_mode=solver.options.f_stop_mode,
    )
