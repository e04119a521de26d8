"""Model-agnostic fixed-point machinery: options, budgets, the one solve, phantom gradient, sequential mode."""

from ..core.schema import OptionError
from .budget import Budget
from .kept_state import KeptState
from .options import FixedPointOptions
from .sequential import solve_sequence
from .solve import FixedPointSolver
from .stats import ConvergenceTally, FixedPointStats, chain_chunks, penalised, warn_not_converged, with_retried_rows

__all__ = [
    "Budget",
    "ConvergenceTally",
    "FixedPointOptions",
    "FixedPointSolver",
    "FixedPointStats",
    "KeptState",
    "OptionError",
    "chain_chunks",
    "penalised",
    "solve_sequence",
    "warn_not_converged",
    "with_retried_rows",
]
