"""A solve as a model's forward makes it, for tests of the solver alone."""

from __future__ import annotations

from implicitlm.deq import FixedPointSolver


def solved(solver: FixedPointSolver, f, z0, training: bool = False, max_iter=None, tol=None, restrict=None):
    """(z, stats) of ``solver`` on ``f`` from ``z0`` with its options' budget of the phase (a
    call's ``max_iter`` / ``tol`` over it); in an evaluation, convergence checked as the model
    checks it (``nonconvergence="error"`` raises)."""
    phase = "training" if training else "simultaneous"
    budget = solver.budget(phase, max_iter, tol)
    z, stats = solver(f, z0, budget, phase=phase, restrict=restrict)
    if not training and not budget.fixed:
        solver.require_convergence(stats, budget.passes, "samples")
    return z, stats
