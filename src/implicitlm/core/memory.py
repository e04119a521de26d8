"""Memory a command is about to use, checked before it allocates.

Sizes come from options and files (a 1 KB config.json can ask for a million layers), and a
process that runs out of memory is killed without a word or stalls the machine. Each
estimate here is a lower bound, so a command is refused only when even that does not fit,
in one line that names the size.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import Callable, Sequence

import torch

from .errors import OptionError

FLOAT_BYTES = 4


def available_bytes(device: torch.device | str | None = None) -> int:
    """Free memory on ``device``: the GPU's, or the machine's available RAM."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def require(
    what: str, needed_bytes: int, device: torch.device | str | None = None, about: bool = False, hint: str = "",
    arguments: Sequence[str] = (),
) -> None:
    """Raise an OptionError (one line) when ``what`` needs more than the memory available.
    ``about``: the size is an estimate, not a lower bound; ``hint``: what would fit instead,
    naming ``arguments`` (``ImplicitLMError.arguments``)."""
    available = available_bytes(device)
    if needed_bytes > available:
        size = f"about {readable(needed_bytes)}" if about else f"at least {readable(needed_bytes)}"
        raise OptionError(f"{what} needs {size} of memory; {readable(available)} is available{hint}", arguments=arguments)


def activation_bytes(batch: int, length: int, width: int, layers: int, graphs: int = 1) -> int:
    """A lower bound on what a forward keeps: one float per token, channel and block, for
    every pass whose graph autograd holds (``graphs``)."""
    return FLOAT_BYTES * batch * length * width * layers * graphs


# What a training step holds, per parameter: the weights, their gradients and AdamW's two moments.
TRAINING_FLOATS_PER_PARAMETER = 4
# What a training forward keeps for the backward pass, per token of the micro-batch: floats
# per channel and block for every pass whose graph autograd holds (a block's projections,
# convolution, scan states and norms), and copies of the logits (the logits, their softmax,
# its gradient and the loss's). Measured on the CPU (a step's peak resident growth, AdamW
# included) for Mamba2 of widths 128 to 768 and 1 to 4 blocks, explicit and with 4 phantom
# steps, and Llama of widths 128 and 256: the measured memory is 0.7 to 1.15 times this
# estimate (Llama, whose attention keeps less, at the low end; Mamba2 at 1 to 1.15).
KEPT_FLOATS_PER_CHANNEL = 48
KEPT_LOGIT_COPIES = 4


def training_step_bytes(
    parameters: int, batch: int, length: int, width: int, layers: int, vocab: int, graphs: int = 1,
) -> int:
    """An estimate of one training step's memory, not a lower bound: weights, gradients and
    AdamW moments, and what the forward of one micro-batch keeps for the backward pass."""
    kept_per_token = KEPT_FLOATS_PER_CHANNEL * width * layers * graphs + KEPT_LOGIT_COPIES * vocab
    return FLOAT_BYTES * (TRAINING_FLOATS_PER_PARAMETER * parameters + batch * length * kept_per_token)


def tensor_bytes(value) -> int:
    """Bytes of the tensors in ``value``: a tensor, or lists, tuples and dataclasses of them."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(item) for item in value)
    if dataclasses.is_dataclass(value):
        return sum(tensor_bytes(getattr(value, field.name)) for field in dataclasses.fields(value))
    return 0


def peak_growth(run: Callable[[], object], device: torch.device | str | None = None) -> int | None:
    """How far ``run()`` raises the peak memory above what is in use before it: a measured
    working set, where a formula would have to know every intermediate of every layer.
    None where the machine cannot say (the peak resident size cannot be reset but on Linux)."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        return torch.cuda.max_memory_allocated(device) - before
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")  # resets the peak resident size (VmHWM) to the current one
        before = _status_bytes("VmRSS")
        run()
        high_water = _status_bytes("VmHWM")
    except OSError:
        return None
    if before is None or high_water is None:
        return None
    return_freed_memory()
    return high_water - before


def return_freed_memory() -> None:
    """Give freed memory back to the system: the allocator keeps freed blocks, scattered
    among live ones, so that a loop of equal steps (a probe and the run it stands for, the
    windows of an evaluation) would grow its peak step by step."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator keeps what it keeps


def _status_bytes(field: str) -> int | None:
    """A size the kernel reports in /proc/self/status, or None where it has no such field."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return None


def readable(size: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} bytes"

