"""Convergence metrics that every fixed-point forward returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FixedPointStats:
    """Per-sample outcome of one fixed-point solve.

    ``iterations``: solver steps each sample needed to get under the tolerance (the budget
    where it never did). ``abs_residual`` / ``rel_residual``: ``||f(z) - z||`` and
    ``||f(z) - z|| / ||f(z)||`` at the returned iterate. ``evaluations``: calls of ``f``
    the solve made for the whole batch (the batch runs until its slowest sample is done).
    """

    iterations: torch.Tensor
    abs_residual: torch.Tensor
    rel_residual: torch.Tensor
    evaluations: int
    tol: float
    stop_mode: str

    @property
    def converged(self) -> torch.Tensor:
        residual = self.rel_residual if self.stop_mode == "rel" else self.abs_residual
        return residual < self.tol

    def summary(self) -> dict[str, float]:
        """Batch means and extremes, for logs."""
        return {
            "fp_iterations_mean": self.iterations.float().mean().item(),
            "fp_iterations_max": self.iterations.max().item(),
            "fp_rel_residual_mean": self.rel_residual.mean().item(),
            "fp_rel_residual_max": self.rel_residual.max().item(),
            "fp_abs_residual_mean": self.abs_residual.mean().item(),
            "fp_converged_share": self.converged.float().mean().item(),
            "fp_evaluations": float(self.evaluations),
        }
