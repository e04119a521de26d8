"""Mamba2's state-space dual (SSD) scan in pure PyTorch: chunked parallel form and one-token step.

Recurrence per head h (state of size headdim x d_state):
    state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T,    y_t = state_t C_t
The chunked form computes it exactly (up to float rounding) with matrix products: inside
a chunk through the masked decay matrix, across chunks through a short scan of chunk
states. The naive loop ``ssd_reference`` is the oracle the tests compare against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def segment_sum(x: torch.Tensor) -> torch.Tensor:
    """(..., T) -> (..., T, T) with out[i, j] = sum_{j < k <= i} x[k], and -inf above the diagonal.

    Built from a masked cumulative sum rather than a difference of cumsums, so large
    decays do not cancel catastrophically.
    """
    length = x.shape[-1]
    x = x.unsqueeze(-1).expand(*x.shape, length)
    strict = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=-1)
    x = x.masked_fill(~strict, 0.0)
    sums = torch.cumsum(x, dim=-2)
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device))
    return sums.masked_fill(~lower, float("-inf"))


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan for any sequence length.

    x: (b, l, h, p); dt: (b, l, h), already softplus'd; A: (h,), negative;
    B, C: (b, l, g, n) with h divisible by g; initial_state: (b, h, p, n) or None.
    Returns y: (b, l, h, p) and the state after the last token: (b, h, p, n).
    """
    batch, length, heads, _ = x.shape
    B = B.repeat_interleave(heads // B.shape[2], dim=2)
    C = C.repeat_interleave(heads // C.shape[2], dim=2)
    # Padding with dt = 0 adds tokens that neither decay nor feed the state, so the
    # final state is exact and the padded outputs are simply dropped.
    chunk_size = min(chunk_size, length)
    pad = (-length) % chunk_size
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        dt = F.pad(dt, (0, 0, 0, pad))
    chunks = (length + pad) // chunk_size

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, chunks, chunk_size, *t.shape[2:])

    xdt = split(x * dt.unsqueeze(-1))                       # b c l h p
    B, C = split(B), split(C)                               # b c l h n
    log_decay = split(dt * A).permute(0, 3, 1, 2)           # b h c l
    cum_decay = torch.cumsum(log_decay, dim=-1)

    # Within a chunk: y_i = sum_{j<=i} (C_i . B_j) exp(sum_{j<k<=i} a_k) xdt_j
    decay_matrix = torch.exp(segment_sum(log_decay))        # b h c l s
    scores = torch.einsum("bclhn,bcshn->bhcls", C, B) * decay_matrix
    y_within = torch.einsum("bhcls,bcshp->bclhp", scores, xdt)

    # State contributed by each chunk on its own, taken to the chunk's end.
    decay_to_end = torch.exp(cum_decay[..., -1:] - cum_decay)                # b h c l
    chunk_states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_to_end, xdt)
    if initial_state is None:
        initial_state = x.new_zeros(batch, heads, x.shape[-1], B.shape[-1])
    chunk_states = torch.cat([initial_state.unsqueeze(1), chunk_states], dim=1)

    # Scan across chunks: the state entering chunk c collects all earlier chunks.
    chunk_decay = torch.exp(segment_sum(F.pad(cum_decay[..., -1], (1, 0))))  # b h c+1 c+1
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, chunk_states)
    entering, final_state = states[:, :-1], states[:, -1]

    # Between chunks: the entering state, decayed to each position, read out by C.
    y_across = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, entering, torch.exp(cum_decay))
    y = (y_within + y_across).reshape(batch, chunks * chunk_size, heads, -1)
    return y[:, :length], final_state


def ssd_step(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence. state: (b, h, p, n); x: (b, h, p); dt: (b, h); B, C: (b, g, n).

    Returns (y: (b, h, p), new state); the input state is not modified.
    """
    heads = x.shape[1]
    B = B.repeat_interleave(heads // B.shape[1], dim=1)
    C = C.repeat_interleave(heads // C.shape[1], dim=1)
    decay = torch.exp(dt * A)[..., None, None]
    state = state * decay + (dt.unsqueeze(-1) * x).unsqueeze(-1) * B.unsqueeze(2)
    y = torch.einsum("bhpn,bhn->bhp", state, C)
    return y, state


def ssd_reference(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive token-by-token recurrence: the oracle for ``ssd_chunked``."""
    batch, length, heads, headdim = x.shape
    state = initial_state
    if state is None:
        state = x.new_zeros(batch, heads, headdim, B.shape[-1])
    ys = []
    for t in range(length):
        y, state = ssd_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t])
        ys.append(y)
    return torch.stack(ys, dim=1), state
