"""Memory a command is about to use, checked before it allocates.

Sizes come from options and files (a 1 KB config.json can ask for a million layers), and a
process that runs out of memory is killed without a word or stalls the machine. Each
estimate here is a lower bound, so a command is refused only when even that does not fit,
in one line that names the size.
"""

from __future__ import annotations

import os

import torch

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


def require(what: str, needed_bytes: int, device: torch.device | str | None = None) -> None:
    """Raise ValueError (one line) when ``what`` needs more than the memory available."""
    available = available_bytes(device)
    if needed_bytes > available:
        raise ValueError(f"{what} needs at least {readable(needed_bytes)} of memory; {readable(available)} is available")


def activation_bytes(batch: int, length: int, width: int, layers: int, graphs: int = 1) -> int:
    """A lower bound on what a forward keeps: one float per token, channel and block, for
    every pass whose graph autograd holds (``graphs``)."""
    return FLOAT_BYTES * batch * length * width * layers * graphs


def readable(size: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} bytes"

