"""Mamba1's selective scan in pure PyTorch: chunked parallel form and one-token step.

Recurrence per channel d (a diagonal state of d_state entries n):
    state_t[d, n] = exp(dt_t[d] A[d, n]) state_{t-1}[d, n] + dt_t[d] x_t[d] B_t[n],
    y_t[d] = sum_n state_t[d, n] C_t[n]
Unlike Mamba2's one decay per head, the decay differs per channel and state entry, so a
chunk's work does not reduce to products of (C_i . B_j) scores: the chunked form takes
every position's state from the decays between all pairs of positions of the chunk, and
carries the state from chunk to chunk (a loop over chunks, not tokens). Its work and
memory per chunk grow as chunk_size^2 * d_inner * d_state, chunk_size times the
recurrence's, so small chunks suit it. The naive loop ``selective_scan_reference`` is the
oracle the tests compare against.
"""

from __future__ import annotations

import torch

from .ssd import segment_sum


def selective_scan_chunked(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked selective scan for any sequence length.

    x: (b, l, d); dt: (b, l, d), already softplus'd; A: (d, n), negative; B, C: (b, l, n);
    initial_state: (b, d, n) or None. Returns y: (b, l, d) in the dtype of x (without the D
    skip) and the state after the last token: (b, d, n), computed in at least the dtype of A.
    """
    work = torch.promote_types(x.dtype, A.dtype)
    state = initial_state
    if state is None:
        state = x.new_zeros(x.shape[0], x.shape[2], A.shape[1])
    state, A = state.to(work), A.to(work)
    outputs = []
    for start in range(0, x.shape[1], chunk_size):
        chunk = (t[:, start : start + chunk_size].to(work) for t in (x, dt, B, C))
        y, state = _scan_chunk(*chunk, A, state)
        outputs.append(y)
    return torch.cat(outputs, dim=1).to(x.dtype), state


def _scan_chunk(
    x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, A: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk from the state before it: (y, state after the chunk's last token)."""
    length = dt.shape[1]
    future = torch.ones(length, length, dtype=torch.bool, device=dt.device).triu(1).unsqueeze(-1)  # i j 1
    # elapsed[:, i, j] = sum_{j<k<=i} dt_k, the time from just after token j to token i: a
    # masked cumulative sum rather than a difference of cumsums, so no cancellation and no
    # overflow however strong the decay.
    elapsed = segment_sum(dt.transpose(1, 2)).permute(0, 2, 3, 1).masked_fill(future, 0.0)  # b i j d
    # The future is masked after the exp: an infinite elapsed time would give A a NaN
    # gradient (0 * inf).
    decay = torch.exp(elapsed.unsqueeze(-1) * A).masked_fill(future.unsqueeze(-1), 0.0)  # b i j d n
    inputs = (dt * x).unsqueeze(-1) * B.unsqueeze(2)  # b j d n
    states = (decay * inputs.unsqueeze(1)).sum(2)  # b i d n
    states = states + torch.exp(torch.cumsum(dt, dim=1).unsqueeze(-1) * A) * state.unsqueeze(1)
    return torch.einsum("bldn,bln->bld", states, C), states[:, -1]


def selective_scan_step(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token. state: (b, d, n); x, dt: (b, d); B, C: (b, n).

    Returns (y: (b, d) in the dtype of x, new state in at least the dtype of A); the input
    state is not modified.
    """
    work = torch.promote_types(x.dtype, A.dtype)
    state, dt, B, C = state.to(work), dt.to(work), B.to(work), C.to(work)
    decay = torch.exp(dt.unsqueeze(-1) * A)
    state = state * decay + (dt * x).unsqueeze(-1) * B.unsqueeze(1)
    return torch.einsum("bdn,bn->bd", state, C).to(x.dtype), state


def selective_scan_reference(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive token-by-token recurrence: the oracle for ``selective_scan_chunked``."""
    state = initial_state
    if state is None:
        state = x.new_zeros(x.shape[0], x.shape[2], A.shape[1])
    ys = []
    for t in range(x.shape[1]):
        y, state = selective_scan_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t])
        ys.append(y)
    return torch.stack(ys, dim=1), state
