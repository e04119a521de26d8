"""A solve to a tolerance, per sample: ``RowTracker`` is the ``f`` a solver iterates.

A solver only proposes iterates; the tracker decides per sample. A sample whose residual is
under the tolerance is frozen at that pass's image f(z) and never evaluated again: from
then on its rows of ``f`` are the identity (the solver sees it as solved and its later iterates
are dropped) while the others continue, and the tracker ends the solve when the last sample is
frozen or the budget is spent. The solvers' own stop tests are switched off (tol 0): they are
batch-wide (torchdeq's Broyden also gives up on the whole batch when it stalls), so they would
make a sample's answer depend on its batch. Every solver here treats each sample alone
otherwise (per-sample norms, batched small solves), so a sample's iterates, its answer and its
pass count are the same in any batch. A sample that never gets under the tolerance returns its
lowest-residual image.

A sample may also be given up before the budget is spent, counted as diverged and frozen at its
lowest-residual image: when its absolute residual (its step length) has stayed above
``divergence_growth`` times its first one for ``divergence_patience`` passes in a row, or
at once when its image f(z) is not finite. Rises alone are no sign: in simultaneous mode a
sample's step grows for as long as its later tokens catch up (for about as many passes as the
sequence has tokens), and safeguarded Anderson and Broyden rise and fall on their way; only a
runaway iteration grows far beyond where it started. A non-finite image is never returned nor
handed back to the solver, whose per-sample linear algebra would otherwise carry one sample's
NaN into a batch-wide error; a sample that never had a finite image has nothing to return, and
the solve raises ``NumericalFault``.

Frozen rows cost nothing when the caller can restrict ``f`` to a subset of rows (``restrict``,
as both modes of the models do); otherwise ``f`` runs on the whole batch and the frozen rows'
outputs are dropped.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from ..core.errors import NumericalFault
from .options import FixedPointOptions
from .residuals import computed_dtype, held_tolerance, row_norms
from .stats import FixedPointStats

FixedPointFn = Callable[[torch.Tensor], torch.Tensor]
# rows -> f on those rows only: (len(rows), ...) -> (len(rows), ...).
RestrictFn = Callable[[torch.Tensor], FixedPointFn]
# (rows evaluated, mask of those whose best image this pass became, or None: all).
ImprovedFn = Callable[["torch.Tensor | None", "torch.Tensor | None"], None]


def solve_to_tolerance(
    solver: Callable, f: FixedPointFn, z0: torch.Tensor, max_passes: int, tol: float, options: FixedPointOptions,
    described: str, restrict: RestrictFn | None = None, on_improved: ImprovedFn | None = None,
) -> tuple[torch.Tensor, FixedPointStats]:
    """No-grad solve from ``z0`` by the iterate generator ``solver`` (``deq/solvers``): at most
    ``max_passes`` passes (evaluations of ``f``), each sample stopped under ``tol`` (raised to the map's
    precision floor). ``described``: what the stats call the solve.

    ``restrict(rows)``: ``f`` on those batch rows only; given, frozen samples are no longer
    evaluated (it is called each time the set of running samples shrinks).
    ``on_improved(rows, better)``: after each pass, the batch rows it ran on and a mask of
    those whose image became their best, the one the solve returns (None: all of them); what a
    caller needs to keep more of that pass (``KeptState``)."""
    stop_mode = options.stop_mode
    tol = held_tolerance(tol, computed_dtype(z0))
    # The solver's iterates, and so its residual norms and its small linear solves (Anderson,
    # Broyden), in at least float32, whatever the model's precision: a half-precision norm of a
    # few thousand entries, or a least-squares system in bfloat16, loses the digits the stop
    # test reads. The map itself runs in its own dtype.
    work = torch.promote_types(z0.dtype, torch.float32)
    f, restrict = _iterated_in(work, z0.dtype, f), _restricted_in(work, z0.dtype, restrict)
    tracker = RowTracker(f, restrict, max_passes, tol, stop_mode, options, on_improved)
    with torch.no_grad(), contextlib.suppress(_SolveDone):
        solver(tracker, x0=z0.to(work), max_iter=max_passes, tol=0.0, stop_mode=stop_mode)
    never_finite = ~torch.isfinite(tracker.best_abs)
    if bool(never_finite.any()):
        raise NumericalFault(
            f"fixed-point solve: f(z) was NaN or infinite at every evaluation for {int(never_finite.sum())} "
            f"of {never_finite.numel()} samples; there is no finite iterate to return"
        )
    return tracker.best.to(z0.dtype), FixedPointStats(
        passes=tracker.passes(),
        abs_residual=tracker.best_abs, rel_residual=tracker.best_rel,
        diverged=tracker.diverged, non_finite=tracker.non_finite,
        batch_passes=tracker.calls, row_passes=tracker.row_passes,
        tol=tol, stop_mode=stop_mode, solver=described,
    )


def _iterated_in(work: torch.dtype, model: torch.dtype, f: FixedPointFn) -> FixedPointFn:
    """``f`` taking and giving iterates in ``work``, run in the model's dtype ``model``."""
    if work == model:
        return f
    return lambda z: f(z.to(model)).to(work)


def _restricted_in(work: torch.dtype, model: torch.dtype, restrict: RestrictFn | None) -> RestrictFn | None:
    if restrict is None or work == model:
        return restrict
    return lambda rows: _iterated_in(work, model, restrict(rows))


class _SolveDone(Exception):
    """Raised by the tracker to end the solver's loop: every sample is frozen or the budget spent."""


class RowTracker:
    """``f`` as the solver sees it: evaluated on the running samples only, each judged by
    its own residual, frozen once under ``tol`` or given up (diverged), all of them
    retired when the budget is spent.

    The residual of an evaluated point z is ``||f(z) - z||`` (divided by ``||f(z)||`` in
    rel mode), as the solvers define it. Diverged: before the budget's last pass,
    a non-finite residual, or an absolute residual above ``divergence_growth`` times the
    sample's first one at ``divergence_patience`` passes in a row (0: never); at the
    last pass every sample still running has simply hit the budget.
    """

    def __init__(
        self, f: FixedPointFn, restrict: RestrictFn | None, max_passes: int, tol: float, stop_mode: str,
        options: FixedPointOptions, on_improved: ImprovedFn | None = None,
    ) -> None:
        self.f, self.restrict, self.on_improved = f, restrict, on_improved
        self.max_passes, self.tol, self.relative = max_passes, tol, stop_mode == "rel"
        self.patience, self.growth = options.divergence_patience, options.divergence_growth
        self.calls = 0
        self.row_passes = 0
        self.active: torch.Tensor | None = None  # indices of the samples still running
        self._f_active = f  # f on exactly the active rows (when restricted)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        if self.active is None:
            self._start(z)
        rows = self.active
        z_rows, fz_rows = self._evaluate(z, rows)
        self.calls += 1
        abs_res = row_norms(fz_rows - z_rows)
        rel_res = abs_res / (row_norms(fz_rows) + 1e-9)
        residual = rel_res if self.relative else abs_res
        finite = torch.isfinite(residual)
        converged = residual < self.tol  # False for NaN: a non-finite residual never converges
        # At the budget's last pass, a sample still running has hit the budget, whatever its residual.
        budget_left = self.calls < self.max_passes
        diverged = ~converged & (~finite | self._ran_away(rows, abs_res)) & budget_left
        done = converged | diverged | (not budget_left)
        better = residual < self._best_residual(rows)  # never NaN: the best stays finite
        # The one read of the device per pass (a host sync on a GPU), three answers in one
        # transfer: whether a sample is done, which changes the rows to run; and whether every
        # image improved and every residual is finite, the usual case, whose bookkeeping is a
        # plain copy. Otherwise it is decided on the device, by masks.
        any_done, all_better, all_finite = torch.stack([done.any(), better.all(), finite.all()]).tolist()
        self._keep_best(rows, fz_rows, abs_res, rel_res, None if all_better else better)
        if self.on_improved is not None:
            self.on_improved(rows, None if all_better else better)
        if not all_finite:
            # The solver never sees a NaN, whose batched solves would spread it to other samples:
            # a non-finite image is replaced by that sample's best one.
            self._mark(self.non_finite, rows, ~finite)
            fz_rows = torch.where(finite.view(-1, *[1] * (fz_rows.dim() - 1)), fz_rows, self._rows_of(self.best, rows))
        if any_done:
            self._mark(self.diverged, rows, diverged)
            stopped = converged | diverged
            self.stopped_at.index_copy_(0, rows, torch.where(stopped, self.calls, self.stopped_at.index_select(0, rows)))
            self._retire(rows, done)
        if self.active.numel() == 0:
            raise _SolveDone
        # Samples frozen at earlier calls: the identity, so they stay where the solver put them.
        return fz_rows if rows.numel() == z.shape[0] else z.index_copy(0, rows, fz_rows)

    def passes(self) -> torch.Tensor:
        """Passes each sample had: until it converged or diverged, else all of them."""
        return torch.where(self.stopped_at > 0, self.stopped_at, self.calls)

    def _start(self, z: torch.Tensor) -> None:
        batch = z.shape[0]
        self.active = torch.arange(batch, device=z.device)
        self.stopped_at = torch.zeros(batch, dtype=torch.long, device=z.device)
        self.diverged = torch.zeros(batch, dtype=torch.bool, device=z.device)
        self.non_finite = torch.zeros(batch, dtype=torch.bool, device=z.device)
        self.best = z.clone()  # what a sample whose every residual is NaN gets back
        dtype = torch.promote_types(z.dtype, torch.float32)
        self.best_abs = torch.full((batch,), float("inf"), dtype=dtype, device=z.device)
        self.best_rel = torch.full((batch,), float("inf"), dtype=dtype, device=z.device)
        # Divergence watch, on the absolute residual: the first one, and how many
        # passes in a row it has been far above that.
        self.first_abs = torch.full((batch,), float("inf"), dtype=dtype, device=z.device)
        self.far_run = torch.zeros(batch, dtype=torch.long, device=z.device)

    def _evaluate(self, z: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, f(z)) on ``rows``, counting the rows actually computed."""
        if rows.numel() == z.shape[0]:
            self.row_passes += rows.numel()
            return z, self._f_active(z)
        z_rows = z.index_select(0, rows)
        if self.restrict is not None:
            self.row_passes += rows.numel()
            return z_rows, self._f_active(z_rows)
        self.row_passes += z.shape[0]
        return z_rows, self.f(z).index_select(0, rows)

    def _best_residual(self, rows: torch.Tensor) -> torch.Tensor:
        return self._rows_of(self.best_rel if self.relative else self.best_abs, rows)

    def _rows_of(self, tensor: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        # Every pass runs this: on the whole batch (the usual case until the first
        # sample freezes) it is the tensor itself, without a gather.
        return tensor if rows.numel() == tensor.shape[0] else tensor.index_select(0, rows)

    def _keep_best(self, rows, fz_rows, abs_res, rel_res, better: torch.Tensor | None) -> None:
        """Each row's best image and residuals: the new ones where ``better`` (None: everywhere),
        chosen on the device by a select, not by masked indexing, which would read the mask's
        count on the host."""
        for kept, new in ((self.best, fz_rows), (self.best_abs, abs_res), (self.best_rel, rel_res)):
            if better is not None:
                new = torch.where(better.view(-1, *[1] * (new.dim() - 1)), new, self._rows_of(kept, rows))
            if rows.numel() == kept.shape[0]:
                kept.copy_(new)
            else:
                kept.index_copy_(0, rows, new)

    def _mark(self, flags: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> None:
        """``flags`` set on the ``rows`` where ``mask`` holds, without reading it on the host."""
        if rows.numel() == flags.shape[0]:
            flags |= mask
        else:
            flags.index_copy_(0, rows, flags.index_select(0, rows) | mask)

    def _ran_away(self, rows: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Whether each row's absolute residual (its step length) has now been above
        ``growth`` times its first one at ``patience`` passes in a row. Not the
        relative residual, whatever the stop mode: it stays bounded (|a - 1| / |a| for
        z -> a z + b) while the iterate runs off."""
        if self.patience == 0:
            return torch.zeros_like(residual, dtype=torch.bool)
        if self.calls == 1:  # every sample is running at the first pass
            self.first_abs.copy_(residual)
        if rows.numel() == self.first_abs.numel():
            run = torch.where(residual > self.growth * self.first_abs, self.far_run + 1, 0)
            self.far_run.copy_(run)
        else:
            run = torch.where(residual > self.growth * self.first_abs[rows], self.far_run[rows] + 1, 0)
            self.far_run[rows] = run
        return run >= self.patience

    def _retire(self, rows: torch.Tensor, done: torch.Tensor) -> None:
        self.active = rows[~done]
        if self.restrict is not None and self.active.numel() > 0:
            self._f_active = self.restrict(self.active)
