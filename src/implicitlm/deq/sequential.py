"""Sequential (RNN) mode: one fixed point per token, the recurrent state read-only while solving.

For token t the solver iterates ``z_t <- step(z_t, u_t, state_{t-1})``, where ``step``
also returns the state its pass reached; token t + 1 reads the state of the pass that
gave token t's answer (``KeptState``: no commit pass after the solve). The stop test is
the solver's own, per sample, so a sample's answer never depends on what else is in the
batch. A sample frozen for token t is also left out of token t's further steps: they
run on the rows still iterating, with their slices of u_t and the state.

Every token's solve is an evaluation solve: with ``nonconvergence="error"``, the
sequence raises ``NumericalFault`` once all its tokens are solved, counting the tokens
short of the tolerance.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .kept_state import KeptState, ReplaceRowsFn, SelectRowsFn
from .solver import FixedPointSolver
from .stats import FixedPointStats

StepFn = Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Any]]
# (t, the previous token's fixed point or None, the state before token t) -> token t's first iterate.
GuessFn = Callable[[int, "torch.Tensor | None", Any], torch.Tensor]


def solve_sequence(
    step: StepFn,
    injection: torch.Tensor,
    state: Any,
    solver: FixedPointSolver,
    hidden_size: int,
    max_iter: int,
    tol: float,
    select_rows: SelectRowsFn,
    replace_rows: ReplaceRowsFn,
    initial_guess: GuessFn | None = None,
) -> tuple[torch.Tensor, Any, FixedPointStats]:
    """Run tokens ``injection[:, t]`` one by one; returns (z of shape (B, L, D), state, stats).

    ``select_rows(state, rows)``: the state of batch rows ``rows``; ``replace_rows(state,
    rows, new)``: ``state`` with those rows taken from ``new``. ``initial_guess(t,
    z_previous, state)``: where token t's solve starts (``z_previous``: None for the first
    token; ``state``: the one token t reads); None: z = 0. ``stats`` fields have shape (B, L):
    iterations and residuals of every token's solve."""
    batch, length = injection.shape[:2]
    outputs, iterations, abs_res, rel_res, diverged, non_finite = [], [], [], [], [], []
    evaluations = row_evaluations = 0
    zeros = injection.new_zeros(batch, hidden_size)  # read-only for the solvers: one for all tokens
    for t in range(length):
        kept = KeptState(_token_map(step, injection[:, t], state, select_rows), select_rows, replace_rows)
        z0 = zeros if initial_guess is None else initial_guess(t, outputs[-1] if outputs else None, state)
        z_t, stats = solver.solve(kept.f, z0, max_iter, tol, kept.restrict, phase="sequential",
                                  on_improved=kept.improved)
        tol = stats.tol  # the tolerance the solve held, raised to its precision's floor
        state = kept.state
        outputs.append(z_t)
        iterations.append(stats.iterations)
        abs_res.append(stats.abs_residual)
        rel_res.append(stats.rel_residual)
        diverged.append(stats.diverged)
        non_finite.append(stats.non_finite)
        evaluations += stats.evaluations
        row_evaluations += stats.row_evaluations
    stats = FixedPointStats(
        iterations=torch.stack(iterations, dim=1),
        abs_residual=torch.stack(abs_res, dim=1),
        rel_residual=torch.stack(rel_res, dim=1),
        diverged=torch.stack(diverged, dim=1),
        non_finite=torch.stack(non_finite, dim=1),
        evaluations=evaluations,
        row_evaluations=row_evaluations,
        tol=tol,
        stop_mode=solver.options.stop_mode,
        solver=solver.options.described_solver("sequential", passes=0),
    )
    solver.require_convergence(stats, max_iter, "tokens")
    return torch.stack(outputs, dim=1), state, stats


def _token_map(step: StepFn, u_t: torch.Tensor, state: Any, select_rows: SelectRowsFn):
    """rows (None: all) -> z -> step(z, u_t, state) on those rows; u_t and the state are
    sliced once per call (the solve makes one each time the rows still running change)."""
    def on_rows(rows: torch.Tensor | None):
        u_rows = u_t if rows is None else u_t.index_select(0, rows)
        state_rows = state if rows is None else select_rows(state, rows)
        return lambda z: step(z, u_rows, state_rows)

    return on_rows
