"""Sequential (RNN) mode: one fixed point per token, the recurrent state read-only while solving.

For token t the solver iterates ``z_t <- step(z_t, u_t, state_{t-1})`` where ``step``
returns a candidate next state that is thrown away; once z_t has converged, one more
``step`` commits the state that token t + 1 reads. The stop test is the solver's own,
per sample, so a sample's answer never depends on what else is in the batch. With
``select_rows``, a sample frozen for token t is also left out of token t's further
steps: they run on the rows still iterating, with their slices of u_t and the state.

Every token's solve is an evaluation solve: with ``eval_nonconvergence="error"``, the
sequence raises ``NumericalFault`` once all its tokens are solved, counting the tokens
short of the tolerance. A token whose commit step gives a non-finite output raises at
once: the state committed with it is what every later token reads.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..faults import NumericalFault
from .solver import FixedPointFn, FixedPointSolver, RestrictFn
from .stats import FixedPointStats

StepFn = Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Any]]
SelectRowsFn = Callable[[Any, torch.Tensor], Any]


def solve_sequence(
    step: StepFn,
    injection: torch.Tensor,
    state: Any,
    solver: FixedPointSolver,
    hidden_size: int,
    max_iter: int,
    tol: float,
    select_rows: SelectRowsFn | None = None,
) -> tuple[torch.Tensor, Any, FixedPointStats]:
    """Run tokens ``injection[:, t]`` one by one; returns (z of shape (B, L, D), state, stats).

    ``select_rows(state, rows)``: the state of batch rows ``rows``; given, converged
    samples are not recomputed. ``stats`` fields have shape (B, L): iterations and
    residuals of every token's solve; its evaluations include each token's commit step.
    """
    batch, length = injection.shape[:2]
    outputs, iterations, abs_res, rel_res, diverged, non_finite = [], [], [], [], [], []
    evaluations = row_evaluations = 0
    z0 = injection.new_zeros(batch, hidden_size)  # read-only for the solvers: one for all tokens
    for t in range(length):
        u_t = injection[:, t]
        restrict = None if select_rows is None else _restricted(step, u_t, state, select_rows)
        z_t, stats = solver.solve(_token_map(step, u_t, state), z0, max_iter, tol, restrict)
        z_t, state = step(z_t, u_t, state)
        _require_finite(z_t, t)
        outputs.append(z_t)
        iterations.append(stats.iterations)
        abs_res.append(stats.abs_residual)
        rel_res.append(stats.rel_residual)
        diverged.append(stats.diverged)
        non_finite.append(stats.non_finite)
        evaluations += stats.evaluations + 1
        row_evaluations += stats.row_evaluations + batch
    stats = FixedPointStats(
        iterations=torch.stack(iterations, dim=1),
        abs_residual=torch.stack(abs_res, dim=1),
        rel_residual=torch.stack(rel_res, dim=1),
        diverged=torch.stack(diverged, dim=1),
        non_finite=torch.stack(non_finite, dim=1),
        evaluations=evaluations,
        row_evaluations=row_evaluations,
        tol=tol,
        stop_mode=solver.options.f_stop_mode,
        solver=solver.options.f_solver,
    )
    solver.require_convergence(stats, max_iter, "tokens")
    return torch.stack(outputs, dim=1), state, stats


def _require_finite(z_t: torch.Tensor, t: int) -> None:
    bad = ~torch.isfinite(z_t.flatten(1)).all(dim=1)
    if bool(bad.any()):
        raise NumericalFault(f"sequential solve: the output committed at token {t} is NaN or infinite for "
                             f"{int(bad.sum())} of {bad.numel()} samples")


def _token_map(step: StepFn, u_t: torch.Tensor, state: Any) -> FixedPointFn:
    return lambda z: step(z, u_t, state)[0]


def _restricted(step: StepFn, u_t: torch.Tensor, state: Any, select_rows: SelectRowsFn) -> RestrictFn:
    """rows -> the token map on those rows; u_t and the state are sliced once per call
    (the solve calls it only when the rows still running change), not once per step."""
    return lambda rows: _token_map(step, u_t.index_select(0, rows), select_rows(state, rows))
