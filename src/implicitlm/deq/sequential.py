"""Sequential (RNN) mode: one fixed point per token, the recurrent state read-only while solving.

For token t the solve iterates ``z_t <- step(z_t, u_t, state_{t-1})``, where ``step`` also
returns the state its pass reached; token t + 1 reads the state of the pass that gave token
t's answer (``KeptState``: no commit pass after the solve). Each token is one call of the
solve with the sequence's budget: to a tolerance, the stop test is per sample, so a sample's
answer never depends on what else is in the batch, and a sample frozen for token t is left
out of token t's further steps (they run on the rows still iterating, with their slices of
u_t and the state); of exactly K passes, every row runs K steps from the state the previous
token's last pass left.

Every token's solve is an evaluation solve: with ``nonconvergence="error"``, the sequence
raises ``NumericalFault`` once all its tokens are solved, counting the tokens short of the
tolerance.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .budget import Budget
from .kept_state import KeptState, ReplaceRowsFn, SelectRowsFn
from .solve import FixedPointSolver
from .stats import FixedPointStats, per_token

# (z_t, u_t, the state before token t) -> (token t's image, the state its pass reached).
StepFn = Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Any]]
# (t, the previous token's answer or None, the state before token t) -> token t's first iterate.
GuessFn = Callable[[int, "torch.Tensor | None", Any], torch.Tensor]


def solve_sequence(
    step: StepFn,
    injection: torch.Tensor,
    state: Any,
    solver: FixedPointSolver,
    hidden_size: int,
    budget: Budget,
    select_rows: SelectRowsFn,
    replace_rows: ReplaceRowsFn,
    initial_guess: GuessFn | None = None,
) -> tuple[torch.Tensor, Any, FixedPointStats]:
    """Run tokens ``injection[:, t]`` one by one, each solved within ``budget``; returns (z of
    shape (B, L, D), state, stats).

    ``select_rows(state, rows)``: the state of batch rows ``rows``; ``replace_rows(state,
    rows, new)``: ``state`` with those rows taken from ``new``. ``initial_guess(t,
    z_previous, state)``: where token t's solve starts (``z_previous``: None for the first
    token; ``state``: the one token t reads); None: z = 0. ``stats`` fields have shape (B, L):
    passes and residuals of every token's solve."""
    batch, length = injection.shape[:2]
    outputs, token_stats = [], []
    zeros = injection.new_zeros(batch, hidden_size)  # read-only for the solvers: one for all tokens
    for t in range(length):
        kept = KeptState(_token_map(step, injection[:, t], state, select_rows), select_rows, replace_rows)
        z0 = zeros if initial_guess is None else initial_guess(t, outputs[-1] if outputs else None, state)
        z_t, stats = solver(kept.f, z0, budget, phase="sequential", restrict=kept.restrict, on_improved=kept.improved)
        state = kept.state
        outputs.append(z_t)
        token_stats.append(stats)
    stats = per_token(token_stats)
    if not budget.fixed:
        solver.require_convergence(stats, budget.passes, "tokens")
    return torch.stack(outputs, dim=1), state, stats


def _token_map(step: StepFn, u_t: torch.Tensor, state: Any, select_rows: SelectRowsFn):
    """rows (None: all) -> z -> step(z, u_t, state) on those rows; u_t and the state are
    sliced once per call (the solve makes one each time the rows still running change)."""
    def on_rows(rows: torch.Tensor | None):
        u_rows = u_t if rows is None else u_t.index_select(0, rows)
        state_rows = state if rows is None else select_rows(state, rows)
        return lambda z: step(z, u_rows, state_rows)

    return on_rows
