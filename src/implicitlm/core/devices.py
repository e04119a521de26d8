"""The device and dtype a model runs on, named on the command line or in lm-eval's model
arguments. ``auto``, the commands' default, is a GPU where the machine has one, else the CPU.

torch accepts names that nothing here can run on (``meta`` holds shapes without values,
``mps`` needs another build), and fails on them deep inside a forward: a name is checked
once, here, before any model is loaded."""

from __future__ import annotations

import re

from .errors import OptionError

# The dtypes a model can be loaded or cast to, by the names the command line and lm-eval use.
DTYPES = ("float32", "bfloat16", "float16", "float64")
# torch refuses "cuda:01" deep in a command (a traceback), and wraps an index past its 8-bit
# range ("cuda:128" is cuda:-128): N is the index as torch writes it, within that range.
DEVICE_NAME = re.compile(r"auto|cpu|cuda(?::(0|[1-9]\d{0,2}))?")
MAX_DEVICE_INDEX = 127
DEVICE_NAMES = "auto, cpu, cuda or cuda:N"


def check_device_name(name: str) -> str:
    """``name`` if it names a device of a kind models run on; a check of its form alone, which
    the command line makes before it imports torch."""
    match = DEVICE_NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None or int(match.group(1) or 0) > MAX_DEVICE_INDEX:
        index = f" (N: a GPU's index, 0 to {MAX_DEVICE_INDEX}, no leading zeros)" if str(name).startswith("cuda:") else ""
        raise OptionError(f"device must be {DEVICE_NAMES}; got {name!r}{index}", arguments=("device",))
    return name


def usable_device(name: str | None, cuda_fallback: bool = False):
    """The torch device ``name`` (default: the CPU; ``auto``: cuda where torch sees a GPU, else
    the CPU), refused unless this machine has it. ``cuda_fallback``: "cuda" without a GPU is
    the CPU (lm-eval's command line asks for cuda by default) instead of an error."""
    import torch  # here, not at the top: the command line checks names before it loads torch

    name = "cpu" if name is None else check_device_name(name)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0 and cuda_fallback:
        return torch.device("cpu")
    if count == 0:
        raise OptionError(f"device {name}: this machine has no CUDA GPU (use cpu)", arguments=("device",))
    if device.index is not None and device.index >= count:
        raise OptionError(f"device {name}: this machine has {count} CUDA GPU{'s' * (count > 1)} "
                          f"(cuda:0 to cuda:{count - 1})", arguments=("device",))
    return device
