"""What test stand-ins for a model need beyond their forward."""

from __future__ import annotations

import contextlib

from implicitlm.deq import ConvergenceTally


class ExplicitStub:
    """Mixed into a stand-in model: evaluations track convergence around every model; an
    explicit one has no fixed points to count."""

    @contextlib.contextmanager
    def track_convergence(self, tally: ConvergenceTally | None = None):
        yield ConvergenceTally() if tally is None else tally
