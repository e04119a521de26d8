"""Other libraries' log lines and progress bars that would tell our users something untrue or
nothing at all, dropped while the call that provokes them runs."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


@contextlib.contextmanager
def without_log_lines(logger_name: str, text: str) -> Iterator[None]:
    """Inside, the records of the logger ``logger_name`` whose message holds ``text`` are dropped."""

    def kept(record: logging.LogRecord) -> bool:
        return text not in record.getMessage()

    logger = logging.getLogger(logger_name)
    logger.addFilter(kept)
    try:
        yield
    finally:
        logger.removeFilter(kept)


@contextlib.contextmanager
def without_progress_bar() -> Iterator[None]:
    """transformers' progress bars off while inside, then as they were."""
    # Imported here: the command line reads this module before it needs transformers.
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            transformers_logging.enable_progress_bar()
