"""What one solve may spend: the budget every fixed point is found with, handed to the solve.

A budget is counted in passes, a pass being one evaluation of the map (one pass of the stack
over the tokens). It is one of three kinds:

- ``tolerance``: iterate until each sample's residual is under ``tol``, at most ``passes``
  passes (the cap); in training, the phantom-gradient steps follow;
- ``passes``: exactly ``passes`` passes of plain iteration without gradients, nothing checked
  between them (test-time compute as a number of passes); ``tol`` is only what reports set the
  last step's residual against;
- ``unrolled``: exactly ``passes`` passes with autograd through every one (training's unroll).

``jacobian_penalty``: in training, the weight of the Jacobian penalty added at the answer (0:
none). The solver gives a call its budget from its options' defaults and the call's own
(``FixedPointSolver.budget``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.errors import OptionError

KINDS = ("tolerance", "passes", "unrolled")


@dataclass(frozen=True)
class Budget:
    """One solve's budget: its ``kind`` (one of ``KINDS``), its ``passes`` (the cap of a solve to
    a tolerance, the number of the others), its ``tol`` and its ``jacobian_penalty``."""

    kind: str
    passes: int
    tol: float
    jacobian_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise OptionError(f"a budget's kind is one of {', '.join(KINDS)}; got {self.kind!r}")

    @classmethod
    def to_tolerance(cls, tol: float, max_passes: int, jacobian_penalty: float = 0.0) -> Budget:
        return cls("tolerance", max_passes, tol, jacobian_penalty)

    @classmethod
    def exactly(cls, passes: int, tol: float) -> Budget:
        return cls("passes", passes, tol)

    @classmethod
    def unrolled(cls, passes: int, tol: float, jacobian_penalty: float = 0.0) -> Budget:
        return cls("unrolled", passes, tol, jacobian_penalty)

    @classmethod
    def probe(cls) -> Budget:
        """One pass, to an infinite tolerance that every residual meets: a memory probe's solve,
        which holds as much as any other without gradients and counts as converged."""
        return cls.to_tolerance(math.inf, 1)

    @property
    def fixed(self) -> bool:
        """Whether the passes are a number, not a cap: no tolerance is held, nothing retried."""
        return self.kind != "tolerance"
