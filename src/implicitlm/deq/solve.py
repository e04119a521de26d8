"""The one solve: every fixed point, simultaneous or token by token, in training or inference,
is one call of ``FixedPointSolver`` with the ``Budget`` it may spend, as torchdeq's whole
contract is one call whatever the budget.

A budget to a tolerance runs the solver the options name for the phase, sample by sample
(``row_tracker``); a budget of exactly K passes, with or without gradients, runs the one K-pass
loop (``passes``). In training a solve to a tolerance is followed by the phantom-gradient steps
(torchdeq's ``backward_factory``), and a budget with a Jacobian penalty adds it at the answer.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchdeq.grad import backward_factory
from torchdeq.loss import jac_reg

from ..core.errors import NumericalFault, OptionError
from .budget import Budget
from .options import FixedPointOptions
from .passes import solve_in_passes
from .row_tracker import FixedPointFn, ImprovedFn, RestrictFn, solve_to_tolerance
from .solvers import get_solver
from .solvers.anderson import Mixing
from .stats import FixedPointStats

# What a solve is for; each may run its own solver (FixedPointOptions.solver_for).
PHASES = ("training", "simultaneous", "sequential")


class FixedPointSolver:
    """Finds z* = f(z*) within a budget, with the gradient path of its phase: in training a
    solve to a tolerance without gradients and the phantom-gradient steps, or an unroll; in
    inference, no gradients."""

    def __init__(self, options: FixedPointOptions, mixing: Mixing | None = None) -> None:
        """``mixing``: the model's learned mixing, for the solvers that mix their steps by it."""
        self.options = options
        self._solvers = {phase: get_solver(options.solver_for(phase), mixing) for phase in PHASES}
        # torchdeq's phantom-gradient functor: phantom_steps damped steps with autograd on.
        self._phantom = backward_factory(grad_type=options.phantom_steps, tau=options.tau)

    def budget(self, mode: str, max_iter: int | None = None, tol: float | None = None,
               passes: int | None = None) -> Budget:
        """The ``Budget`` this solver gives a solve of ``mode`` on a call's ``max_iter``, ``tol``
        and ``passes`` (None: its options' own, as ``FixedPointOptions.budget`` fills them in), as
        torchdeq's solver holds its defaults and takes a call's own. Training: an unroll of
        ``unroll_steps`` where set, else a solve to ``train_tol`` within ``train_max_iter``, each
        with the Jacobian penalty; an inference: exactly ``passes`` passes where set, else a solve
        to ``tol`` within ``max_iter``."""
        options = self.options
        max_iter, tol = options.budget(max_iter, tol, mode)
        if mode == "training":
            if options.unroll_steps:
                return Budget.unrolled(options.unroll_steps, tol, options.jacobian_penalty)
            return Budget.to_tolerance(tol, max_iter, options.jacobian_penalty)
        passes = options.passes if passes is None else passes
        return Budget.exactly(passes, tol) if passes else Budget.to_tolerance(tol, max_iter)

    def __call__(
        self, f: FixedPointFn, z0: torch.Tensor, budget: Budget, phase: str = "simultaneous",
        restrict: RestrictFn | None = None, on_improved: ImprovedFn | None = None,
    ) -> tuple[torch.Tensor, FixedPointStats]:
        """(z, stats) of the solve of ``f`` from ``z0`` within ``budget``, by the solver of
        ``phase`` (one of ``PHASES``: "training", or an inference's "simultaneous" (a sequence
        or chunk) or "sequential" (a token)). ``restrict`` and ``on_improved``: as
        ``row_tracker.solve_to_tolerance`` takes them (a budget of passes runs every row and
        calls ``on_improved(None, None)`` once at the end). Whether the answer is close enough
        is the caller's to check (``require_convergence``), after any retry of its own."""
        if phase not in PHASES:
            raise OptionError(f"phase must be one of {', '.join(PHASES)}; got {phase!r}")
        training = phase == "training"
        if budget.kind == "tolerance":
            # Here, where every solve to a tolerance passes (both modes, each chunk and token,
            # training, a Jacobian's token), rather than at each entrance that hands one on.
            self.options.check_budget(budget.passes, budget.tol, training=training)
        if budget.kind == "tolerance" and budget.passes:
            z, stats = solve_to_tolerance(self._solvers[phase], f, z0, budget.passes, budget.tol, self.options,
                                          self.options.described_solver(phase, passes=0), restrict, on_improved)
        else:
            # A budget of passes, or none at all (training's phantom steps from z0 alone).
            passes = budget.passes if budget.kind == "passes" else 0
            described = "unroll" if budget.kind == "unrolled" else self.options.described_solver(phase, passes)
            z, stats = solve_in_passes(f, z0, budget, self.options.stop_mode, described, on_improved)
        if training and budget.kind == "tolerance":
            z = self._phantom(None, _damped(f), z.detach())[-1]
        if training and budget.jacobian_penalty > 0:
            stats.jacobian_penalty = budget.jacobian_penalty * jacobian_frobenius(f, z)
        return z, stats

    def require_convergence(self, stats: FixedPointStats, max_passes: int, unit: str) -> None:
        """With ``nonconvergence="error"``: raise NumericalFault, in one line, if any of
        the ``unit`` (samples, tokens) that ``stats`` describe missed the tolerance.
        ``max_passes``: the budget they had."""
        missed = ~stats.converged
        if self.options.nonconvergence != "error" or not bool(missed.any()):
            return
        raise NumericalFault(
            f"fixed point not reached for {int(missed.sum())} of {missed.numel()} {unit}: "
            f"{int(stats.unconverged.sum())} hit the budget of {max_passes} passes, "
            f"{int(stats.diverged.sum())} diverged; worst {stats.stop_mode} residual "
            f"{stats.residual[missed].max().item():.3g} vs tolerance {stats.tol:g}"
        )


def jacobian_frobenius(f: FixedPointFn, z: torch.Tensor) -> torch.Tensor:
    """``||df/dz||_F^2 / z.numel()`` at ``z``, estimated with one random probe (Hutchinson,
    torchdeq's ``jac_reg``), with the graph to train on it: one more pass of ``f`` and a
    backward through it that the loss's backward differentiates again."""
    z = z.detach().requires_grad_()
    # The loss's backward differentiates f's backward again. The fused attention kernels have
    # no double backward (on the CPU: "derivative for ..._flash_attention_for_cpu_backward is
    # not implemented"); the math kernel is plain differentiable operations.
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        return jac_reg(f(z), z, vecs=1, create_graph=True)


def _damped(f: FixedPointFn) -> Callable[..., torch.Tensor]:
    def damped(z: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
        return tau * f(z) + (1.0 - tau) * z

    return damped
