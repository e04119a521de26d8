"""Speed options of the trainer: mixed precision and torch.compile."""

from __future__ import annotations

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState


def resolve_precision(precision: str) -> str:
    """accelerate's ``mixed_precision``: "auto" is bf16 autocast on CUDA, full precision elsewhere."""
    if precision == "auto":
        return "bf16" if torch.cuda.is_available() else "no"
    return precision


def accelerator_for(precision: str, **options) -> Accelerator:
    """accelerate's ``Accelerator`` at ``precision`` (see ``resolve_precision``); ``options``
    go to it. accelerate keeps one state per process and refuses an Accelerator of another
    precision after the first, so each run starts from a fresh one: a second run in one
    process (a notebook, a sweep, the tests) may change it. The process group (accelerate's
    PartialState) is kept."""
    AcceleratorState._reset_state(reset_partial_state=False)
    return Accelerator(mixed_precision=resolve_precision(precision), **options)


def compile_stack(model, backend: str = "inductor") -> None:
    """Compile the stack in place (parameter names unchanged, so checkpoints are too): it is
    what the solver calls over and over; the loop around it stays eager."""
    model.stack.compile(backend=backend)
