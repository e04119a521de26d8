"""Signals sent to the test process itself."""

from __future__ import annotations

import signal
import threading


def signal_this_thread(number: int) -> None:
    """Deliver ``number`` to the calling thread, so that its Python handler has run when
    this returns. ``os.kill(os.getpid(), ...)`` may hand the signal to any of the process's
    threads (torch's among them), and the handler then runs at some later point of the
    main thread: a test asserting right after would race it."""
    signal.pthread_kill(threading.get_ident(), number)
