"""Convergence metrics that every fixed-point forward returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FixedPointStats:
    """Per-sample outcome of one fixed-point solve.

    ``iterations``: evaluations each sample had until it got under the tolerance or was
    given up as diverged (the budget where neither happened); a sample is frozen from
    then on. ``abs_residual`` / ``rel_residual``: ``||f(z) - z||`` and
    ``||f(z) - z|| / ||f(z)||`` at the iterate z whose image f(z) is returned.
    ``diverged``: given up before the budget was spent (residual growing at every
    evaluation for a while, or not finite); such a sample returns its lowest-residual
    finite image; ``non_finite``: those of them whose image f(z) was NaN or infinite at some
    evaluation. Every sample is exactly one of ``converged``, ``diverged`` and
    ``unconverged`` (the budget spent, the tolerance not reached). ``evaluations``: calls
    of ``f``, each on the samples still running (the batch runs until its slowest sample
    is done); ``row_evaluations``: samples computed over all those calls: the honest cost
    where frozen samples are left out of the calls (as both modes of the models do), the
    batch size times ``evaluations`` where they are computed and dropped. ``solver``: the
    name of the solver that produced them.
    """

    iterations: torch.Tensor
    abs_residual: torch.Tensor
    rel_residual: torch.Tensor
    diverged: torch.Tensor
    non_finite: torch.Tensor
    evaluations: int
    row_evaluations: int
    tol: float
    stop_mode: str
    solver: str

    @property
    def residual(self) -> torch.Tensor:
        """The residual the tolerance applies to (the stop mode's)."""
        return self.rel_residual if self.stop_mode == "rel" else self.abs_residual

    @property
    def converged(self) -> torch.Tensor:
        # A NaN residual compares False: it never counts as converged.
        return self.residual < self.tol

    @property
    def unconverged(self) -> torch.Tensor:
        """Spent the whole budget without getting under the tolerance."""
        return ~self.converged & ~self.diverged

    def summary(self) -> dict[str, float | str]:
        """Batch means, extremes and failure counts, and the solver's name, for logs."""
        return {
            "fp_solver": self.solver,
            "fp_iterations_mean": self.iterations.float().mean().item(),
            "fp_iterations_max": self.iterations.max().item(),
            "fp_rel_residual_mean": self.rel_residual.mean().item(),
            "fp_rel_residual_max": self.rel_residual.max().item(),
            "fp_abs_residual_mean": self.abs_residual.mean().item(),
            "fp_converged_share": self.converged.float().mean().item(),
            "fp_unconverged": float(self.unconverged.sum().item()),
            "fp_diverged": float(self.diverged.sum().item()),
            "fp_non_finite": float(self.non_finite.sum().item()),
            "fp_evaluations": float(self.evaluations),
            "fp_row_evaluations": float(self.row_evaluations),
        }
