"""Convergence metrics that every fixed-point forward returns."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

LOGGER = logging.getLogger("implicitlm")


@dataclass
class FixedPointStats:
    """Per-sample outcome of one fixed-point solve.

    What a solve spends is counted in passes, a pass being one evaluation of ``f`` (one pass
    of the stack over the tokens). ``passes``: the passes each sample had until it got under
    the tolerance or was given up as diverged (the budget where neither happened); a sample
    is frozen from then on. ``abs_residual`` / ``rel_residual``: ``||f(z) - z||`` and
    ``||f(z) - z|| / ||f(z)||`` at the iterate z whose image f(z) is returned.
    ``diverged``: given up before the budget was spent (residual growing at every pass for a
    while, or not finite); such a sample returns its lowest-residual finite image;
    ``non_finite``: those of them whose image f(z) was NaN or infinite at some pass. Every
    sample is exactly one of ``converged``, ``diverged`` and ``unconverged`` (the budget
    spent, the tolerance not reached). ``batch_passes``: calls of ``f`` (passes of the
    batch), each on the samples still running (the batch runs until its slowest sample is
    done); ``row_passes``: samples computed over all those calls (one sample's pass each):
    the honest cost where frozen samples are left out of the calls (as both modes of the
    models do), the batch size times ``batch_passes`` where they are computed and dropped.
    ``solver``: the name of the solver that produced them. ``jacobian_penalty``: in training
    with the option of that name, the term to add to the loss (with its graph; see
    ``penalised``). ``fixed_passes``: K for a solve of exactly K passes (``deq/passes.py``),
    whose residual is its last pass's step and whose samples above the tolerance are
    answers short of a fixed point by design, not failures; 0: a solve to the tolerance.
    ``retry_passes``: of each sample's ``passes``, those spent solving it again after it
    missed the tolerance (a chunk's rows re-solved in shorter chunks; None: none).
    """

    passes: torch.Tensor
    abs_residual: torch.Tensor
    rel_residual: torch.Tensor
    diverged: torch.Tensor
    non_finite: torch.Tensor
    batch_passes: int
    row_passes: int
    tol: float
    stop_mode: str
    solver: str
    jacobian_penalty: torch.Tensor | None = None
    fixed_passes: int = 0
    retry_passes: torch.Tensor | None = None

    @property
    def retried(self) -> torch.Tensor:
        """Each sample's passes spent in retries (``retry_passes``, zeros where none)."""
        return torch.zeros_like(self.passes) if self.retry_passes is None else self.retry_passes

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
        """Batch means, extremes and failure counts, and the solver's name, for logs; what the
        solve spent in passes: each sample's (``fp_passes_mean``/``_max``, from ``passes``),
        the calls of ``f`` (``fp_batch_passes``, from ``batch_passes``) and the samples they
        computed (``fp_row_passes``, from ``row_passes``)."""
        penalty = {} if self.jacobian_penalty is None else {"fp_jacobian_penalty": self.jacobian_penalty.item()}
        return {
            **penalty,
            "fp_solver": self.solver,
            "fp_passes_mean": self.passes.float().mean().item(),
            "fp_passes_max": self.passes.max().item(),
            "fp_rel_residual_mean": self.rel_residual.mean().item(),
            "fp_rel_residual_max": self.rel_residual.max().item(),
            "fp_abs_residual_mean": self.abs_residual.mean().item(),
            "fp_converged_share": self.converged.float().mean().item(),
            "fp_unconverged": float(self.unconverged.sum().item()),
            "fp_diverged": float(self.diverged.sum().item()),
            "fp_non_finite": float(self.non_finite.sum().item()),
            "fp_batch_passes": float(self.batch_passes),
            "fp_row_passes": float(self.row_passes),
        }


def penalised(loss: torch.Tensor, stats: FixedPointStats | None) -> torch.Tensor:
    """The loss to train on: ``loss`` plus the solve's Jacobian penalty, if it has one."""
    if stats is None or stats.jacobian_penalty is None:
        return loss
    return loss + stats.jacobian_penalty


def chain_chunks(chunks: list[FixedPointStats]) -> FixedPointStats:
    """One sample's solves of consecutive chunks of its sequence, as one solve of the whole.

    Passes add up; residuals are the worst chunk's, so a sample counts as converged exactly
    when every chunk did; diverged and non-finite when any chunk was."""
    return dataclasses.replace(
        chunks[0],
        passes=torch.stack([c.passes for c in chunks]).sum(dim=0),
        abs_residual=torch.stack([c.abs_residual for c in chunks]).amax(dim=0),
        rel_residual=torch.stack([c.rel_residual for c in chunks]).amax(dim=0),
        diverged=torch.stack([c.diverged for c in chunks]).any(dim=0),
        non_finite=torch.stack([c.non_finite for c in chunks]).any(dim=0),
        batch_passes=sum(c.batch_passes for c in chunks),
        row_passes=sum(c.row_passes for c in chunks),
        retry_passes=None if all(c.retry_passes is None for c in chunks) else
        torch.stack([c.retried for c in chunks]).sum(dim=0),
    )


def per_token(tokens: list[FixedPointStats]) -> FixedPointStats:
    """The solves of a sequence's tokens one by one (sequential mode), as stats of shape
    (batch, tokens); the tolerance the last one held (every token's, raised to the same floor)."""
    return dataclasses.replace(
        tokens[-1],
        passes=torch.stack([t.passes for t in tokens], dim=1),
        abs_residual=torch.stack([t.abs_residual for t in tokens], dim=1),
        rel_residual=torch.stack([t.rel_residual for t in tokens], dim=1),
        diverged=torch.stack([t.diverged for t in tokens], dim=1),
        non_finite=torch.stack([t.non_finite for t in tokens], dim=1),
        batch_passes=sum(t.batch_passes for t in tokens),
        row_passes=sum(t.row_passes for t in tokens),
    )


def with_retried_rows(
    stats: FixedPointStats, rows: torch.Tensor, retry: FixedPointStats, taken: torch.Tensor
) -> FixedPointStats:
    """``stats`` after samples ``rows`` were solved again (``retry``, of those rows only):
    where ``taken`` (a mask over ``rows``), their outcome is the retry's; their passes, and
    the batch's, add up both solves, the retry's passes counted as retries too."""
    def replaced(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
        return mine.index_copy(0, rows[taken], theirs[taken].to(mine.dtype))

    return dataclasses.replace(
        stats,
        passes=stats.passes.index_add(0, rows, retry.passes.to(stats.passes.dtype)),
        retry_passes=stats.retried.index_add(0, rows, retry.passes.to(stats.passes.dtype)),
        abs_residual=replaced(stats.abs_residual, retry.abs_residual),
        rel_residual=replaced(stats.rel_residual, retry.rel_residual),
        diverged=replaced(stats.diverged, retry.diverged),
        non_finite=replaced(stats.non_finite, retry.non_finite),
        batch_passes=stats.batch_passes + retry.batch_passes,
        row_passes=stats.row_passes + retry.row_passes,
    )


@dataclass(eq=False)  # compared by identity: the model keeps a list of the tallies open
class ConvergenceTally:
    """What the fixed points of any number of solves came to.

    A fixed point is a sample's in simultaneous mode and a token's in sequential mode. Those of
    solves to the tolerance that stopped above it, for reasons that exclude each other:
    ``non_finite`` (an image was NaN or infinite), ``diverged`` (given up as running away, all
    images finite), ``budget`` (the budget spent short of the tolerance); ``retried``: those
    solved again after missing it, and ``retry_passes`` the passes the retries spent.
    ``in_passes``: the fixed points of solves of exactly K passes, which hold no tolerance, so
    that none of them counts as stopped above it (a non-finite one is still counted as
    ``non_finite``: a NaN answer is a fault whatever the budget); what they are is their last
    pass's residual (the stop mode's), summed over the ``finite_in_passes`` finite ones in
    ``passes_residual``, its largest in ``passes_residual_max``; ``passes``: their K (the
    largest, were there several)."""

    fixed_points: int = 0
    budget: int = 0
    diverged: int = 0
    non_finite: int = 0
    retried: int = 0
    retry_passes: int = 0
    in_passes: int = 0
    finite_in_passes: int = 0
    passes_residual: float = 0.0
    passes_residual_max: float = 0.0
    passes: int = 0

    def add(self, stats: FixedPointStats) -> None:
        count = stats.passes.numel()
        self.fixed_points += count
        self.non_finite += int(stats.non_finite.sum())
        if stats.fixed_passes:
            self.in_passes += count
            self.passes = max(self.passes, stats.fixed_passes)
            residual = stats.residual.double()
            finite = residual[torch.isfinite(residual)]
            self.finite_in_passes += finite.numel()
            if finite.numel():
                self.passes_residual += float(finite.sum())
                self.passes_residual_max = max(self.passes_residual_max, float(finite.max()))
            return
        self.diverged += int((stats.diverged & ~stats.non_finite).sum())
        self.budget += int((stats.unconverged & ~stats.non_finite).sum())
        self.retried += int((stats.retried > 0).sum())
        self.retry_passes += int(stats.retried.sum())

    @property
    def not_converged(self) -> int:
        return self.budget + self.diverged + self.non_finite

    @property
    def not_converged_share(self) -> float:
        return self.not_converged / self.fixed_points if self.fixed_points else 0.0

    def as_dict(self) -> dict[str, float]:
        """The figures results and metadata carry (``fp_`` keys, as training logs have them): of
        the solves to the tolerance, the misses, their reasons and the retries (passes per fixed
        point solved to it); of the solves of exactly K passes, their count, K and their last
        pass's residual, mean and largest."""
        to_tolerance = self.fixed_points - self.in_passes
        figures: dict[str, float] = {"fp_fixed_points": self.fixed_points, "fp_non_finite": self.non_finite}
        if to_tolerance:
            figures.update(fp_not_converged=self.not_converged, fp_not_converged_share=self.not_converged_share,
                           fp_stopped_at_budget=self.budget, fp_diverged=self.diverged, fp_retried=self.retried,
                           fp_retry_passes_mean=self.retry_passes / to_tolerance)
        if self.in_passes:
            figures.update(fp_in_passes=self.in_passes, fp_passes_per_solve=self.passes,
                           fp_last_residual_mean=self.passes_residual / max(1, self.finite_in_passes),
                           fp_last_residual_max=self.passes_residual_max)
        return figures

    def warning(self, what: str) -> str | None:
        """One line saying what stopped above the tolerance in ``what`` (or was not finite); None
        if nothing did."""
        if not self.not_converged:
            return None
        return (
            f"{what}: {self.not_converged} of {self.fixed_points} fixed points ({self.not_converged_share:.2%}) "
            f"stopped above the tolerance: {self.budget} at the budget of passes, {self.diverged} diverged, "
            f"{self.non_finite} non-finite"
        )


def warn_not_converged(tally: ConvergenceTally, what: str) -> None:
    """Log ``tally``'s one-line warning (on stderr where logging is not set up), if any."""
    line = tally.warning(what)
    if line is not None:
        LOGGER.warning(line)
