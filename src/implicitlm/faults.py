"""Errors for runs stopped by their own numbers rather than by bad input.

Bad input raises ``ValueError`` subclasses and exits with code 2; these exit with code 1:
the input was valid, but the run cannot go on without giving a wrong answer.
"""

from __future__ import annotations


class NumericalFault(RuntimeError):
    """NaN or Inf in a loss, gradient or iterate, or a fixed point not reached where that is fatal.

    The message is one line naming where it happened and what was kept."""
