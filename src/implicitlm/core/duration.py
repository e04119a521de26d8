"""Time a command is about to take, checked before the long work starts.

A size can fit in memory and still never finish: a work read in windows or sequences
keeps its memory flat while its time grows with the size, and such a run ends only when it
is killed. The estimate here is the size of the work times the cost of a piece of it,
measured on one piece (a lower bound: the piece at its cheapest); a work past ``MAX_SECONDS`` is refused in one line that names the
size, and one past ``NOTICE_SECONDS`` is told its estimate before it starts.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Sequence

from .errors import OptionError

LOGGER = logging.getLogger("implicitlm")

# A run longer than a day is taken for a size given by mistake: a longer one is split
# (fewer lengths, sequences or words per call) or run on a faster machine.
MAX_SECONDS = 24 * 3600
# A run this long is told its estimate, so that a user can stop it before it is spent.
NOTICE_SECONDS = 10 * 60


def seconds_of(run: Callable[[], object]) -> float:
    """How long ``run()`` takes, on the wall clock."""
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def require_time(what: str, seconds: float, arguments: Sequence[str] = (), hint: str = "") -> None:
    """Raise an OptionError (one line) when ``what`` would take more than ``MAX_SECONDS``,
    naming ``arguments`` (``ImplicitLMError.arguments``); ``hint``: what would fit instead.
    Log the estimate of a run past ``NOTICE_SECONDS``."""
    if seconds > MAX_SECONDS:
        raise OptionError(
            f"{what} would take at least {readable_seconds(seconds)} here, past the limit of "
            f"{readable_seconds(MAX_SECONDS)}{hint}",
            arguments=arguments,
        )
    if seconds > NOTICE_SECONDS:
        LOGGER.warning("%s will take at least %s", what, readable_seconds(seconds))


def readable_seconds(seconds: float) -> str:
    for unit, scale in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= scale:
            return f"{seconds / scale:,.1f} {unit}"
    return f"{seconds:.1f} seconds"
