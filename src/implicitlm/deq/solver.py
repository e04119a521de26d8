"""Fixed-point solve and phantom gradient, on torchdeq's solvers and gradient functors.

The solve runs without autograd from a given start (z = 0 for a fresh sequence); each
sample is judged by its own residual, flattened over all its dimensions, and the batch
stops when its worst sample is under the tolerance. Each sample keeps its
lowest-residual iterate, so a sample that converged early is not degraded by the steps
the rest of the batch still needs.
"""

from __future__ import annotations

from typing import Callable

import torch
from torchdeq.grad import backward_factory
from torchdeq.solver import get_solver

from .options import FixedPointOptions
from .stats import FixedPointStats

FixedPointFn = Callable[[torch.Tensor], torch.Tensor]


class FixedPointSolver:
    """Finds z* = f(z*) and returns it with a gradient path suited to the phase.

    ``__call__`` in training: unroll (warm-up) or no-grad solve + phantom gradient.
    ``__call__`` in evaluation: no-grad solve with the evaluation budget.
    """

    def __init__(self, options: FixedPointOptions) -> None:
        self.options = options
        self._solver = get_solver(options.f_solver)
        # torchdeq's phantom-gradient functor: phantom_steps damped steps with autograd on.
        self._phantom = backward_factory(grad_type=options.phantom_steps, tau=options.tau)

    def __call__(
        self,
        f: FixedPointFn,
        z0: torch.Tensor,
        training: bool,
        max_iter: int | None = None,
        tol: float | None = None,
    ) -> tuple[torch.Tensor, FixedPointStats]:
        opts = self.options
        if not training:
            return self.solve(f, z0, _or(max_iter, opts.eval_f_max_iter), _or(tol, opts.eval_f_tol))
        if opts.unroll_steps > 0:
            return self.unroll(f, z0, opts.unroll_steps)
        z_star, stats = self.solve(f, z0, _or(max_iter, opts.f_max_iter), _or(tol, opts.f_tol))
        z = self._phantom(None, _damped(f), z_star.detach())[-1]
        return z, stats

    def solve(
        self, f: FixedPointFn, z0: torch.Tensor, max_iter: int, tol: float
    ) -> tuple[torch.Tensor, FixedPointStats]:
        """No-grad solve from ``z0``: at most ``max_iter`` evaluations of ``f``."""
        if max_iter == 0:
            return z0, self._stats_without_solve(z0)
        tracker = _ConvergenceTracker(f, tol, self.options.f_stop_mode)
        with torch.no_grad():
            z_star, _, info = self._solver(
                tracker, x0=z0, max_iter=max_iter, tol=tol, stop_mode=self.options.f_stop_mode
            )
        return z_star, FixedPointStats(
            iterations=tracker.iterations(),
            abs_residual=info["abs_lowest"],
            rel_residual=info["rel_lowest"],
            evaluations=tracker.calls,
            tol=tol,
            stop_mode=self.options.f_stop_mode,
        )

    def unroll(self, f: FixedPointFn, z0: torch.Tensor, steps: int) -> tuple[torch.Tensor, FixedPointStats]:
        """Weight-tied unroll with full autograd; residual read off the last two iterates."""
        z_prev, z = z0, z0
        for _ in range(steps):
            z_prev, z = z, f(z)
        with torch.no_grad():
            abs_residual = (z - z_prev).flatten(1).norm(dim=1)
            rel_residual = abs_residual / (z.flatten(1).norm(dim=1) + 1e-9)
        return z, FixedPointStats(
            iterations=torch.full((z0.shape[0],), steps, device=z0.device),
            abs_residual=abs_residual,
            rel_residual=rel_residual,
            evaluations=steps,
            tol=self.options.f_tol,
            stop_mode=self.options.f_stop_mode,
        )

    def _stats_without_solve(self, z0: torch.Tensor) -> FixedPointStats:
        nan = torch.full((z0.shape[0],), float("nan"), device=z0.device)
        return FixedPointStats(
            iterations=torch.zeros(z0.shape[0], dtype=torch.long, device=z0.device),
            abs_residual=nan,
            rel_residual=nan,
            evaluations=0,
            tol=self.options.f_tol,
            stop_mode=self.options.f_stop_mode,
        )


def _damped(f: FixedPointFn) -> Callable[..., torch.Tensor]:
    def damped(z: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
        return tau * f(z) + (1.0 - tau) * z

    return damped


class _ConvergenceTracker:
    """Wraps ``f`` to count its calls and note when each sample first had a residual under ``tol``.

    Read off the evaluations themselves rather than a solver's trace, whose layout
    differs between solvers; the residual of an evaluated point z is ``||f(z) - z||``
    (divided by ``||f(z)||`` in rel mode), as the solvers define it.
    """

    def __init__(self, f: FixedPointFn, tol: float, stop_mode: str) -> None:
        self.f, self.tol, self.relative = f, tol, stop_mode == "rel"
        self.calls = 0
        self.first_converged: torch.Tensor | None = None

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        fz = self.f(z)
        self.calls += 1
        residual = (fz - z).flatten(1).norm(dim=1)
        if self.relative:
            residual = residual / (fz.flatten(1).norm(dim=1) + 1e-9)
        if self.first_converged is None:
            self.first_converged = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
        newly = (self.first_converged == 0) & (residual < self.tol)
        self.first_converged[newly] = self.calls
        return fz

    def iterations(self) -> torch.Tensor:
        """Evaluations each sample needed (all of them for a sample that never converged)."""
        return torch.where(self.first_converged > 0, self.first_converged, self.calls)


def _or(value, default):
    return default if value is None else value
