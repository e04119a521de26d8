"""Validated options of the fixed-point solve and its gradient.

torchdeq reads its options from a loose dict and silently drops keys it does not know
(its ``stop_mode`` for ``f_stop_mode`` runs with the default and no warning). Every option
here is declared, type-checked and range-checked, and an unknown key is an error that
names the closest known one.

These names are the one vocabulary of the fixed-point knobs: the command line's
``--max-iter``, ``--tol``, ``--solver`` and ``--chunk-length``, a Python call's ``max_iter``
and ``tol``, the ``fixed_point`` of a model's config, logs and records all say ``max_iter``,
``tol``, ``solver`` and ``chunk_length`` for inference; training's own budget is
``train_max_iter`` / ``train_tol`` (the curriculum's phases: ``bounded_max_iter``,
``free_max_iter``). Configs saved under torchdeq's names (``eval_f_max_iter``, ``f_solver``
...) are read by ``core.migrations.fixed_point_options``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.errors import OptionError
from ..core.option_names import INITIAL_GUESSES, MAX_PASSES
from ..core.options import Options
from ..core.schema import NON_NEGATIVE, POSITIVE, Rule, at_least, between, check_field, one_of
from .solvers import solver_names

# The solver table's names (deq/solvers/): plain iteration, torchdeq's Anderson and
# Broyden, our safeguarded Anderson, and the same with the checkpoint's learned mixing.
SOLVERS = solver_names()
STOP_MODES = ("rel", "abs")


def every_solve_by(solver: str) -> dict[str, str]:
    """The options that make every solve one by ``solver``: training and both inference modes,
    whatever the per-mode solvers said (a model's ``set_fixed_point_options`` or one call's
    ``fixed_point`` takes them)."""
    return {"solver": solver, "simultaneous_solver": "", "sequential_solver": ""}


def pass_count(minimum: int) -> Rule:
    """A number of passes: at least ``minimum``, at most ``MAX_PASSES``."""
    return between(minimum, MAX_PASSES)


@dataclass(frozen=True)
class FixedPointOptions(Options):
    """How to find the fixed point and how to differentiate through it.

    Training runs ``train_max_iter`` solver steps without gradient, then ``phantom_steps``
    damped steps ``z <- tau f(z) + (1 - tau) z`` with autograd (phantom gradient), unless
    ``unroll_steps > 0``, which replaces both by a fully differentiable weight-tied unroll
    (the warm-up phase). Evaluation has its own budget, the test-time-compute knob.

    ``divergence_patience`` / ``divergence_growth``: a sample whose absolute residual
    (step length) has been above ``divergence_growth`` times its first one at
    ``divergence_patience`` passes in a row is given up as diverged (patience 0:
    never). A converging sample's step may grow for a while (in simultaneous mode, while
    its later tokens catch up), but not a hundredfold beyond where it started.
    ``nonconvergence``: "report" (count the samples short of the tolerance in the
    stats) or "error" (raise NumericalFault); evaluation only, since training phases
    spend tiny budgets on purpose; refused beside ``passes`` above 0, which holds no tolerance.
    ``simultaneous_solver`` / ``sequential_solver``: the solver of an evaluation in
    simultaneous mode (one fixed point per sequence or chunk) and in sequential mode (one
    per token); empty: ``solver``. Which solver pays differs by mode: an accelerated
    solver's per-pass cost is a small linear solve per sample, which a token step of
    a few small matrix products hardly notices and a short chunk of a small model may.
    ``jacobian_penalty``: in training, this weight times an estimate of
    ``||df/dz||_F^2 / numel(z)`` at the solution is added to the loss (Bai et al. 2021,
    "Stabilizing Equilibrium Models by Jacobian Regularization"): a map whose Jacobian is
    smaller contracts faster, so every later solve needs fewer passes. 0: off.
    Every tolerance (``train_tol``, ``tol``, a call's ``tol``) is raised to the
    residual floor of the precision the map computes in (``solver.residual_floor``: twice
    its machine epsilon, 1.6e-2 in bfloat16, 2.0e-3 in float16): a half-precision map's
    rounding keeps the residual above its epsilon's order, and a lower tolerance would
    make every solve spin to its budget. The stats record the tolerance that was held, and
    one warning per process names a raised one.
    ``chunk_length``: an evaluation in simultaneous mode solves a longer sequence in
    chunks of this many tokens, each from the state the previous chunk's fixed point left
    (0: the whole sequence at once). The fixed point is causal, so the answer is the same
    to the tolerance; the cost is not: a whole-sequence solve needs about as many
    passes as the sequence has tokens, and re-solves settled tokens in every one.
    ``retry_depth``: a chunk's rows that missed the tolerance are solved again in chunks of
    half its length, those that miss again at half that, at most this many times (down to
    single tokens at most; 0: never): each level may spend the budget once per piece, so a
    chunk's retries cost at most ``2^(depth+1) - 2`` times its budget (3: 14 times).
    ``passes``: an inference budget of exactly this many passes per solve instead of a
    tolerance (the test-time compute a checkpoint ships for): plain iteration z <- f(z) from
    the start ``initial_guess`` says, in both modes, never checked nor retried
    (``deq/passes.py``); 0: solve to ``tol`` within ``max_iter``.
    Every budget (``train_max_iter``, ``max_iter``, ``unroll_steps``, ``phantom_steps``,
    ``passes``, a call's ``max_iter`` or ``passes``) is at most ``MAX_PASSES`` (10,000) passes.
    """

    solver: str = "fixed_point_iter"
    train_max_iter: int = 4
    train_tol: float = 1e-3
    stop_mode: str = "rel"
    phantom_steps: int = 1
    tau: float = 0.8
    unroll_steps: int = 0
    max_iter: int = 16
    simultaneous_max_iter: int = 0
    tol: float = 1e-3
    divergence_patience: int = 16
    divergence_growth: float = 100.0
    nonconvergence: str = "report"
    chunk_length: int = 0
    simultaneous_solver: str = ""
    sequential_solver: str = ""
    jacobian_penalty: float = 0.0
    initial_guess: str = "zero"
    simultaneous_initial_guess: str = ""
    sequential_initial_guess: str = ""
    passes: int = 0
    retry_depth: int = 3

    WHAT = "fixed-point option"
    FIELD_RULES = {
        "solver": one_of(*SOLVERS), "simultaneous_solver": one_of("", *SOLVERS), "sequential_solver": one_of("", *SOLVERS),
        "stop_mode": one_of(*STOP_MODES), "nonconvergence": one_of("report", "error"),
        "initial_guess": one_of(*INITIAL_GUESSES), "simultaneous_initial_guess": one_of("", *INITIAL_GUESSES),
        "sequential_initial_guess": one_of("", *INITIAL_GUESSES),
        "train_max_iter": pass_count(0), "max_iter": pass_count(1), "simultaneous_max_iter": pass_count(0), "phantom_steps": pass_count(1),
        "unroll_steps": pass_count(0), "passes": pass_count(0), "retry_depth": at_least(0),
        "divergence_patience": at_least(0), "chunk_length": at_least(0),
        "train_tol": POSITIVE, "tol": POSITIVE, "jacobian_penalty": NON_NEGATIVE,
        "divergence_growth": Rule("> 1", lambda growth: growth > 1), "tau": Rule("in (0, 1]", lambda tau: 0 < tau <= 1),
    }
    FIELD_HELP = {
        "solver": "every solve's, unless a mode names its own: " + ", ".join(SOLVERS),
        "simultaneous_solver": "inference in simultaneous mode: solver (empty: solver)",
        "sequential_solver": "inference in sequential (RNN) mode: solver (empty: solver)",
        "train_max_iter": "training: passes of the solve before the phantom-gradient steps",
        "train_tol": "training: residual at which the solve stops",
        "stop_mode": "residual measured relative to |f(z)| (rel) or absolute (abs)",
        "phantom_steps": "training: damped steps with autograd after the solve",
        "tau": "damping of the phantom steps, z <- tau f(z) + (1 - tau) z",
        "unroll_steps": "training: a differentiable unroll of this many steps instead (0: phantom gradient)",
        "max_iter": "inference: most passes of a solve (the test-time-compute knob)",
        "simultaneous_max_iter": "inference in simultaneous mode: most passes of a sequence's or chunk's solve "
                                 "(0: max_iter)",
        "tol": "inference: residual at which the solve stops",
        "divergence_patience": "passes in a row above divergence_growth x the first residual before a sample "
                               "is given up as diverged (0: never)",
        "divergence_growth": "see divergence_patience",
        "nonconvergence": "inference: report (count unconverged samples) or error (raise)",
        "jacobian_penalty": "training: weight of the Jacobian penalty |df/dz|_F^2 / numel at the solution, for a map "
                            "that contracts faster (fewer passes at inference; 0: off)",
        "initial_guess": "inference: where each solve starts, zero or learned (the checkpoint's initial_guess.safetensors, "
                         "from implicitlm solver train), unless a mode names its own",
        "simultaneous_initial_guess": "inference in simultaneous mode: initial_guess (empty: initial_guess)",
        "sequential_initial_guess": "inference in sequential (RNN) mode: initial_guess (empty: initial_guess)",
        "passes": "inference: exactly this many passes (evaluations of the map) per solve, plain iteration from the start "
                  "initial_guess says, no tolerance and no retries (0: solve to tol within max_iter)",
        "retry_depth": "inference in chunks: how many times the rows that missed the tolerance are solved again in "
                       "chunks of half the length (0: never; each level may spend the budget once per piece)",
        "chunk_length": "inference: simultaneous mode solves in chunks of this many tokens, carrying the state "
                             "(0: the whole sequence at once; the trainer sets its training length)",
    }

    def check(self) -> None:
        # Held together, one would be dropped: a budget of K passes has no tolerance to miss.
        if self.passes and self.nonconvergence == "error":
            raise OptionError(f"nonconvergence='error' stops a run whose solves miss tol; passes={self.passes} holds no "
                              "tolerance to miss: set passes=0 to solve to tol, or nonconvergence='report'")

    @classmethod
    def check_budget(cls, max_iter: int | None, tol: float | None, training: bool) -> None:
        """A call's ``max_iter`` and ``tol`` (None: the options' own). ``max_iter`` is held to
        the rule of the field it stands in for: ``train_max_iter`` in training (where 0
        passes leave the phantom steps alone), ``max_iter`` in an evaluation,
        which needs at least one. ``tol`` is a number >= 0 or infinite: 0 asks for the
        tightest the map's precision allows (its floor, ``solver.held_tolerance``); every
        residual meets an infinite one, so each solve stops at its first pass and counts
        as converged (a memory probe's one pass, which no convergence check should fail)."""
        if max_iter is not None:
            field = "train_max_iter" if training else "max_iter"
            check_field("argument", "max_iter", max_iter, int, cls.FIELD_RULES[field])
        if tol is not None and not (isinstance(tol, float) and tol == math.inf):
            check_field("argument", "tol", tol, float, NON_NEGATIVE)

    @classmethod
    def check_call_budget(cls, max_iter: int | None, tol: float | None, training: bool,
                          passes: int | None = None) -> None:
        """A caller's ``max_iter``, ``tol`` and ``passes`` (a forward's, an evaluation's), each
        held to the rule of the option it stands in for, as ``replace`` holds them: a ``tol`` of
        0 or an infinite one is refused there, and only the solver's own probes ask for them."""
        cls.check_budget(max_iter, None, training)
        if tol is not None:
            check_field("argument", "tol", tol, float, cls.FIELD_RULES["tol"])
        if passes is not None:
            check_field("argument", "passes", passes, int, cls.FIELD_RULES["passes"])

    def budget(self, max_iter: int | None, tol: float | None, mode: str = "sequential") -> tuple[int, float]:
        """A call's ``(max_iter, tol)``, each None filled from the options of ``mode``
        ("training", "simultaneous" or "sequential", as ``solver_for``): training's own
        (``train_max_iter``, ``train_tol``), or inference's (``max_iter``, ``tol``; a
        simultaneous solve's ``simultaneous_max_iter`` where set). The one place a default
        budget is filled in."""
        if mode == "training":
            own_max_iter, own_tol = self.train_max_iter, self.train_tol
        else:
            own_max_iter, own_tol = self.max_iter, self.tol
            if mode == "simultaneous" and self.simultaneous_max_iter:
                own_max_iter = self.simultaneous_max_iter
        return (own_max_iter if max_iter is None else max_iter, own_tol if tol is None else tol)

    def solver_for(self, mode: str) -> str:
        """The solver name of a phase: "training", "simultaneous" or "sequential" (evaluation)."""
        chosen = {"training": self.solver, "simultaneous": self.simultaneous_solver,
                  "sequential": self.sequential_solver}[mode]
        return chosen or self.solver

    def described_solver(self, mode: str, passes: int | None = None) -> str:
        """What stats and records call the solve of ``mode``: its solver, or for an inference
        solve of ``passes`` (None: the options' own), "K_passes"; and where an inference solve
        starts from a learned guess, "+learned_guess"."""
        inference = mode != "training"
        passes = self.passes if passes is None else passes
        learned = inference and self.initial_guess_for(mode) == "learned"
        solver = f"{passes}_passes" if inference and passes else self.solver_for(mode)
        return solver + ("+learned_guess" if learned else "")

    def initial_guess_for(self, mode: str) -> str:
        """Where an inference solve of ``mode`` ("simultaneous" or "sequential") starts."""
        chosen = {"simultaneous": self.simultaneous_initial_guess, "sequential": self.sequential_initial_guess}[mode]
        return chosen or self.initial_guess
