"""Reading an SSM's state before every token with a query, all tokens at once: what a learned
initial guess is fitted on (``models/learned_solver.py``), shared by the Mamba1 and Mamba2 mixers.

A scan outputs y_t = C_t h_t, the state after token t read by that token's C. The state
*before* token t + 1 is h_t, so the same scan over tokens 0 .. l - 2 with C_t replaced by
token t + 1's query reads it for every token but the first, whose state is the one given.
"""

from __future__ import annotations

from typing import Callable

import torch

Scan = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def reads_before_each_token(
    scan: Scan, first: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
    queries: torch.Tensor, chunk_size: int, initial_state: torch.Tensor | None,
) -> torch.Tensor:
    """``scan(x, dt, A, B, C, chunk_size, initial_state)`` (``ssd_scan`` or
    ``selective_scan_chunked``) over the tokens' inputs, read by ``queries`` in C's place:
    (b, l, ...) as the scan's output. ``first``: the first token's read of ``initial_state``
    (zeros without one), shaped as one token of the output."""
    if x.shape[1] == 1:
        return first[:, None]
    later, _ = scan(x[:, :-1], dt[:, :-1], A, B[:, :-1], queries[:, 1:], chunk_size, initial_state)
    return torch.cat([first[:, None].to(later.dtype), later], dim=1)
