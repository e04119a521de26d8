"""Training curriculum: which fixed-point regime holds at each step.

An implicit model's phases, in order, each left out where it has no steps
(``TrainConfig.curriculum``):

- ``unroll``: a fully differentiable warm-up through ``unroll_depth`` passes;
- ``bounded``: a few no-grad passes and phantom steps, e.g. the authors' 4+1;
- ``free``: a larger budget with an early-stop tolerance, e.g. their 24+4 at tol 0.05;
- ``contraction``: the free phase's solves with a penalty on the map's Jacobian at their
  solution, so that the map contracts there;
- ``few_pass``: the output of K passes from z = 0 trained as well as the fixed point, still
  solved on the free phase's budget (``few_pass.py``).

The first three are the authors' schedule (``Curriculum.unroll_bounded_free``); the last two
are this package's stages after it. An explicit model has one phase, ``explicit``. Each phase
is a set of ``FixedPointOptions`` overrides that every training forward of the phase is given
(``fixed_point=``), over the model's own options, which stay its defaults, as it saves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..deq.options import FixedPointOptions
from ..core.schema import OptionError
from .few_pass import FewPassLoss


@dataclass(frozen=True)
class Phase:
    """``few_pass``: the few-pass stage's loss in place of the cross-entropy at the fixed point."""

    name: str
    steps: int
    fixed_point: dict[str, Any] = field(default_factory=dict)
    few_pass: FewPassLoss | None = None

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise OptionError(f"phase '{self.name}' has a negative number of steps ({self.steps})")
        FixedPointOptions().replace(**self.fixed_point)  # validates names and values


@dataclass(frozen=True)
class Curriculum:
    phases: tuple[Phase, ...]

    @property
    def total_steps(self) -> int:
        return sum(phase.steps for phase in self.phases)

    def phase_at(self, step: int) -> Phase:
        """The phase that governs optimiser step ``step`` (0-based); the last one past the end."""
        end = 0
        for phase in self.phases:
            end += phase.steps
            if step < end:
                return phase
        return self.phases[-1]

    def boundaries(self) -> list[tuple[int, str]]:
        """(first step, phase name) of every non-empty phase."""
        start, out = 0, []
        for phase in self.phases:
            if phase.steps:
                out.append((start, phase.name))
            start += phase.steps
        return out

    @classmethod
    def unroll_bounded_free(
        cls,
        unroll_steps: int,
        bounded_steps: int,
        free_steps: int,
        unroll_depth: int = 16,
        bounded: tuple[int, int] = (4, 1),
        free: tuple[int, int] = (24, 4),
        free_tol: float = 0.05,
    ) -> "Curriculum":
        """The authors' three phases; (passes, phantom steps) pairs as in the paper's "(4+1)"."""
        return cls(
            (
                Phase("unroll", unroll_steps, {"unroll_steps": unroll_depth}),
                Phase(
                    "bounded",
                    bounded_steps,
                    {"unroll_steps": 0, "train_max_iter": bounded[0], "phantom_steps": bounded[1]},
                ),
                Phase(
                    "free",
                    free_steps,
                    {"unroll_steps": 0, "train_max_iter": free[0], "phantom_steps": free[1], "train_tol": free_tol},
                ),
            )
        )
