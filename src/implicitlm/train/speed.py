"""Speed options of the trainer: the device, mixed precision and torch.compile."""

from __future__ import annotations

import contextlib
import os

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState

from ..core.errors import OptionError

# accelerate's own setting of the device a run of one process trains on.
ACCELERATE_DEVICE = "ACCELERATE_TORCH_DEVICE"


def training_device(device: str | None = None) -> torch.device:
    """Where a run trains: ``device`` (cpu, cuda, cuda:1), or by default the GPU where torch
    sees one, else the CPU (accelerate's choice)."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def resolve_precision(precision: str, device: str | None = None) -> str:
    """accelerate's ``mixed_precision``: "auto" is bf16 autocast on CUDA, full precision elsewhere."""
    if precision == "auto":
        return "bf16" if training_device(device).type == "cuda" else "no"
    return precision


def accelerator_for(precision: str, device: str | None = None, **options) -> Accelerator:
    """accelerate's ``Accelerator`` at ``precision`` (see ``resolve_precision``) on ``device``
    (``training_device``; under torchrun each process takes the GPU of its local rank, or the
    CPU); ``options`` go to it. accelerate keeps one state per process and refuses an
    Accelerator of another precision after the first, so each run starts from a fresh one: a
    second run in one process (a notebook, a sweep, the tests) may change it. The process
    group (accelerate's PartialState) is kept where there is one."""
    place = training_device(device)
    distributed = "LOCAL_RANK" in os.environ
    if distributed and place.index is not None:
        raise OptionError(f"device {place}: under torchrun each process trains on the GPU of its local rank; "
                          "give cuda or cpu", arguments=("device",))
    AcceleratorState._reset_state(reset_partial_state=not torch.distributed.is_initialized())
    # cpu=True is also what makes accelerate set up a (gloo) process group for torchrun on CPU.
    with contextlib.nullcontext() if distributed or place.type == "cpu" else _accelerate_device(place):
        return Accelerator(mixed_precision=resolve_precision(precision, str(place)), cpu=place.type == "cpu", **options)


@contextlib.contextmanager
def _accelerate_device(place: torch.device):
    """accelerate's state on ``place`` as it is made (it reads the setting once), and ``place``
    the current CUDA device, on which kernels that follow it launch."""
    former = os.environ.get(ACCELERATE_DEVICE)
    os.environ[ACCELERATE_DEVICE] = str(place)
    if place.index is not None:
        torch.cuda.set_device(place)
    try:
        yield
    finally:
        if former is None:
            del os.environ[ACCELERATE_DEVICE]
        else:
            os.environ[ACCELERATE_DEVICE] = former


def compile_stack(model, backend: str = "inductor") -> None:
    """Compile the stack in place (parameter names unchanged, so checkpoints are too): it is
    what the solver calls over and over; the loop around it stays eager."""
    model.stack.compile(backend=backend)
