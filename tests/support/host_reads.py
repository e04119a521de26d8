"""Counting what a computation reads back from its device: on a GPU each read is a host sync
(the CPU waits for every queued kernel), which a solve's loop must keep to a minimum.

On a CPU nothing waits, but the same calls are made: ``HostReads`` records them through a
``TorchFunctionMode``, so a test can count them where no GPU is."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

# A tensor's value taken to Python, or a result whose size depends on a tensor's values.
READING_CALLS = {"__bool__", "item", "tolist", "nonzero", "__int__", "__float__", "__index__"}
INDEXING_CALLS = {"__getitem__", "__setitem__"}


class HostReads(TorchFunctionMode):
    """Inside the block, ``count`` is the number of reads of a tensor's values by the host:
    the calls above, and indexing by a boolean mask (whose result's size is the mask's count)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READING_CALLS or (name in INDEXING_CALLS and _has_mask(args[1])):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _has_mask(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(part, torch.Tensor) and part.dtype == torch.bool for part in parts)
