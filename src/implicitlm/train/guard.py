"""What stops a training loop without losing work: a stop signal, and numbers gone wrong.

A SIGTERM (a scheduler pre-empting the job) or SIGINT (Ctrl-C) does not kill the run in
the middle of a step: the loop finishes the step, writes a checkpoint and ends with
``TrainingInterrupted``. A repeated SIGTERM changes nothing: a whole process group is
often signalled at once (``timeout`` or a scheduler signalling torchrun's group, torchrun
forwarding the signal again), and no worker may die before the collective checkpoint. A
second SIGINT raises KeyboardInterrupt, for a person at a run stuck inside a step.

A non-finite loss, gradient norm or fixed-point iterate stops the run before the optimiser
applies the step, so the weights in memory and every checkpoint written so far are the
last good ones. A checkpoint that cannot be written (a full disk) stops it too, naming the
last one written.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from pathlib import Path

import torch

from ..core.atomic_io import WriteError
from ..core.errors import ImplicitLMError, NumericalFault

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(ImplicitLMError):
    """A stop signal ended the run after ``step`` steps, with a checkpoint written."""

    def __init__(self, signal_number: int, step: int, checkpoint: Path) -> None:
        self.signal_number = signal_number
        self.step = step
        self.checkpoint = checkpoint
        name = signal.Signals(signal_number).name
        super().__init__(f"stopped by {name} after step {step}; checkpoint written to {checkpoint}")

    @property
    def exit_code(self) -> int:
        # The shell's convention for a process ended by a signal.
        return 128 + self.signal_number


class StopSignals:
    """Within ``with StopSignals() as stop:``, SIGTERM and SIGINT are recorded in
    ``stop.received`` (the signal number, or None) instead of ending the process."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._interrupted = False  # a SIGINT came: the next one raises KeyboardInterrupt
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        # Python delivers signals to the main thread only; elsewhere nothing is installed.
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._record) for number in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _record(self, number: int, frame) -> None:
        # Raised here rather than left to the handler found on entry, which a library may
        # have set to ignore the signal.
        if number == signal.SIGINT and self._interrupted:
            raise KeyboardInterrupt
        self._interrupted = self._interrupted or number == signal.SIGINT
        self.received = number


def stop_requested(stop: StopSignals, accelerator) -> int | None:
    """The stop signal any process received, or None. Every process gets the same answer:
    the checkpoint that follows is collective, so all must stop at the same step."""
    if accelerator.num_processes == 1:
        return stop.received
    received = torch.tensor(float(stop.received or 0), device=accelerator.device)
    number = int(accelerator.reduce(received, reduction="max").item())
    return number or None


@contextlib.contextmanager
def stop_on_numerical_fault(step: int, last_checkpoint: Path | None):
    """Around one step's forward and backward: a NumericalFault inside (a non-finite loss or
    gradient, or a fixed-point solve with no finite iterate) ends training, naming the step
    and the checkpoint to go back to."""
    try:
        yield
    except NumericalFault as fault:
        kept = f"last good checkpoint: {last_checkpoint}" if last_checkpoint else "no checkpoint had been written"
        raise NumericalFault(f"step {step}: {fault}; training stopped before its update; {kept}") from None


@contextlib.contextmanager
def stop_on_write_failure(last_checkpoint: Path | None):
    """Around writing a checkpoint: a failed write ends training, naming the checkpoint to
    resume from."""
    try:
        yield
    except WriteError as error:
        kept = f"the last checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint had been written"
        raise WriteError(f"{error}; {kept}") from None


def check_finite(loss: float, grad_norm: float, non_finite_iterates: int = 0) -> None:
    """Raise NumericalFault when the loss or the gradient norm is NaN or infinite, or when
    some sample's fixed-point map gave a non-finite image (the solve returned its best
    finite one, but the weights already make the map blow up)."""
    for name, value in (("loss", loss), ("gradient norm", grad_norm)):
        if not math.isfinite(value):
            raise NumericalFault(f"{name} is {value}")
    if non_finite_iterates:
        raise NumericalFault(f"f(z) was NaN or infinite for {non_finite_iterates} sample(s) in the fixed-point solve")


def non_finite_images(output) -> torch.Tensor:
    """Samples of one forward whose fixed-point map gave a non-finite image (0: explicit model)."""
    stats = output.fixed_point
    return stats.non_finite.sum() if stats is not None else torch.zeros((), dtype=torch.long)


def agreed_count(count: torch.Tensor, accelerator) -> int:
    """``count`` summed over all processes: each must take the same decision on it, since
    the next step is collective."""
    if accelerator.num_processes == 1:
        return int(count)
    return int(accelerator.reduce(count.to(accelerator.device), reduction="sum").item())
