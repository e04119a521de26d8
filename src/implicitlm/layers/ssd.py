"""Mamba2's state-space dual (SSD) scan in pure PyTorch: chunked parallel form and one-token step.

Recurrence per head h (state of size headdim x d_state):
    state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T,    y_t = state_t C_t
The chunked form computes it exactly (up to float rounding) with matrix products: inside
a chunk through the masked decay matrix, across chunks through a short scan of chunk
states. The naive loop ``ssd_reference`` is the oracle the tests compare against.
"""

from __future__ import annotations

import torch

from .ssd_kernel import fused_ssd_kernel, notify_fallback_once, pad_to_chunks, run_fused_ssd
from .ssm_parameters import ssm_state_dtype


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


# On a CPU the work inside a chunk grows with the chunk's length while the scan across
# chunks costs little, so shorter chunks than a GPU's 256 are faster there: measured
# fastest at 64 to 128 tokens for lengths 512 to 2048 (benchmarks/mixer.py).
CPU_CHUNK_SIZE = 64
CPU_SINGLE_CHUNK_LENGTH = 128
# Devices the fused kernel runs on (a seam for tests, which have no GPU).
KERNEL_DEVICES = ("cuda",)


def chunk_size_for(length: int, configured: int, device: torch.device) -> int:
    """The chunk length to run a sequence of ``length`` tokens with; never above ``configured``.

    The result does not change the output beyond float rounding, only the cost.
    """
    if device.type != "cpu":
        return configured
    if length <= CPU_SINGLE_CHUNK_LENGTH:
        return min(configured, length)
    return min(configured, CPU_CHUNK_SIZE)


def ssd_chunked(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan for any sequence length.

    x: (b, l, h, p); dt: (b, l, h), already softplus'd; A: (h,), negative;
    B, C: (b, l, g, n) with h divisible by g; initial_state: (b, h, p, n) or None.
    Returns y: (b, l, h, p) and the state after the last token: (b, h, p, n), in
    ``ssm_state_dtype`` (float32 for a half-precision x).

    Heads of one group share B and C, so every product with B or C runs once per group
    with that group's heads side by side (never repeated per head): C B^T costs a
    heads-per-group factor less, and the state products run as one matrix product per
    group and chunk.
    """
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    per_group = heads // groups
    chunk_size = min(chunk_size, length)
    x, dt, B, C = pad_to_chunks(chunk_size, x, dt, B, C)
    chunks = x.shape[1] // chunk_size
    shape = (batch, chunks, chunk_size)

    xdt = (x * dt.unsqueeze(-1)).view(*shape, heads, headdim)                 # b c l h p
    B = B.view(*shape, groups, d_state).transpose(2, 3)                       # b c g l n
    C = C.view(*shape, groups, d_state).transpose(2, 3)                       # b c g l n
    # Decays in at least float32 whatever the input precision: they are exponentiated.
    cum_decay = (dt * A).to(torch.promote_types(x.dtype, torch.float32)).view(*shape, heads).cumsum(2)  # b c l h

    # Within a chunk: y_i = sum_{j<=i} (C_i . B_j) exp(cum_i - cum_j) xdt_j. The decay is a
    # difference of in-chunk cumulative sums, as in the fused kernels: the sums stay
    # small within one chunk, so the cancellation costs little precision.
    cum_by_head = cum_decay.transpose(2, 3)                                   # b c h l
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    # Added to the negated sums rather than subtracted: the backward pass then negates the
    # small (.., l) vector instead of the (.., l, l) gradient.
    log_decay_matrix = (cum_by_head.unsqueeze(-1) + (-cum_by_head).unsqueeze(-2)).masked_fill(~causal, float("-inf"))
    decay_matrix = torch.exp(log_decay_matrix).to(x.dtype).view(*shape[:2], groups, per_group, chunk_size, chunk_size)
    scores = (decay_matrix * (C @ B.transpose(-1, -2)).unsqueeze(3)).flatten(2, 3)  # b c h l s
    y_within = scores @ xdt.transpose(2, 3)                                   # b c h l p

    # State each chunk contributes on its own, at the chunk's end, in the scan's layout
    # (b, c, g, n, r p): heads of a group side by side.
    decay_to_end = torch.exp(cum_decay[:, :, -1:] - cum_decay).to(x.dtype)    # b c l h
    weighted = (xdt * decay_to_end.unsqueeze(-1)).view(*shape, groups, per_group * headdim).transpose(2, 3)
    chunk_states = B.transpose(-1, -2) @ weighted                             # b c g n (r p)

    # Scan across chunks: the state entering each chunk, one short step per chunk, carried
    # in the state's dtype (at least float32, as mamba_ssm's state passing): in half
    # precision every chunk would round the state again, and the rounding compounds.
    work = ssm_state_dtype(x.dtype)
    if initial_state is None:
        initial_state = x.new_zeros(batch, heads, headdim, d_state, dtype=work)
    # Contiguous, so every state of the scan is, and each copy into the output is a block copy.
    initial = initial_state.to(work).view(batch, groups, per_group, headdim, d_state).permute(0, 1, 4, 2, 3).contiguous()
    chunk_decay = torch.exp(cum_decay[:, :, -1]).to(work).view(batch, chunks, groups, 1, per_group, 1)
    contributions = chunk_states.unflatten(-1, (per_group, headdim)).to(work)
    entering, final = _ChunkStatePassing.apply(contributions, chunk_decay, initial)

    # Between chunks: the entering state read out by C, decayed to each position.
    y_across = (C @ entering.flatten(-2).to(x.dtype)).view(*shape[:2], groups, chunk_size, per_group, headdim)
    decay_from_start = torch.exp(cum_decay).to(x.dtype).view(*shape, groups, per_group).transpose(2, 3)  # b c g l r
    y_across = y_across * decay_from_start.unsqueeze(-1)
    y_within = y_within.view(*shape[:2], groups, per_group, chunk_size, headdim).transpose(3, 4)
    y = (y_across + y_within).permute(0, 1, 3, 2, 4, 5).reshape(batch, chunks * chunk_size, heads, headdim)
    final = final.permute(0, 1, 3, 4, 2).reshape(batch, heads, headdim, d_state)  # b g n r p -> b h p n
    return y[:, :length], final


class _ChunkStatePassing(torch.autograd.Function):
    """state_{c+1} = decay_c * state_c + contribution_c over the chunks, with a hand-written
    backward: one in-place step per chunk either way, where autograd would record and
    replay a graph node per chunk and stack their gradients.

    contributions: (b, c, g, n, r, p); decays: (b, c, g, 1, r, 1); initial: (b, g, n, r, p).
    Returns the state entering every chunk (b, c, g, n, r, p) and the final state.
    """

    @staticmethod
    def forward(contributions: torch.Tensor, decays: torch.Tensor, initial: torch.Tensor):
        # Each state is computed straight into its slot of ``entering``: no copies.
        entering = torch.empty_like(contributions)
        entering[:, 0] = initial
        last = contributions.shape[1] - 1
        for c in range(last):
            torch.addcmul(contributions[:, c], entering[:, c], decays[:, c], out=entering[:, c + 1])
        return entering, torch.addcmul(contributions[:, last], entering[:, last], decays[:, last])

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, decays, _ = inputs
        ctx.save_for_backward(decays, output[0])

    @staticmethod
    def backward(ctx, grad_entering: torch.Tensor, grad_final: torch.Tensor):
        decays, entering = ctx.saved_tensors
        if torch.is_grad_enabled():
            # A backward that is itself differentiated (create_graph: a Jacobian penalty
            # in training) cannot write into preallocated slots, which autograd does not record.
            return _state_passing_gradients(grad_entering, grad_final, decays, entering)
        # The gradient with respect to the state leaving chunk c is that of chunk c's
        # contribution: computed straight into grad_contributions[:, c].
        grad_contributions = torch.empty_like(entering)
        grad_decays = torch.empty_like(decays)
        last = entering.shape[1] - 1
        grad_contributions[:, last] = grad_final
        for c in range(last, 0, -1):
            grad_leaving = grad_contributions[:, c]
            torch.sum(grad_leaving * entering[:, c], dim=(2, 4), keepdim=True, out=grad_decays[:, c])
            torch.addcmul(grad_entering[:, c], grad_leaving, decays[:, c], out=grad_contributions[:, c - 1])
        grad_leaving = grad_contributions[:, 0]
        torch.sum(grad_leaving * entering[:, 0], dim=(2, 4), keepdim=True, out=grad_decays[:, 0])
        return grad_contributions, grad_decays, torch.addcmul(grad_entering[:, 0], grad_leaving, decays[:, 0])


def _state_passing_gradients(grad_entering, grad_final, decays, entering):
    """``_ChunkStatePassing``'s backward in out-of-place operations, which autograd records."""
    grad_contributions, grad_decays = [], []
    grad_leaving = grad_final
    for c in range(entering.shape[1] - 1, -1, -1):
        grad_contributions.append(grad_leaving)
        grad_decays.append((grad_leaving * entering[:, c]).sum(dim=(2, 4), keepdim=True))
        grad_leaving = grad_entering[:, c] + grad_leaving * decays[:, c]
    return torch.stack(grad_contributions[::-1], dim=1), torch.stack(grad_decays[::-1], dim=1), grad_leaving


def ssd_scan(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ssd_chunked``'s contract on the fastest path at hand: mamba_ssm's fused kernel on
    CUDA when it imports (one notice when it does not), else the pure-PyTorch scan with a
    chunk length chosen for the device and ``chunk_size`` as its upper bound. float64 takes
    the pure scan everywhere: the kernel accumulates in float32, and a float64 model (a test
    oracle, a Jacobian analysis) asks for more."""
    if x.device.type in KERNEL_DEVICES and x.dtype != torch.float64:
        kernel = fused_ssd_kernel()
        if kernel is not None:
            return run_fused_ssd(kernel, x, dt, A, B, C, chunk_size, initial_state)
        notify_fallback_once("mamba_ssm's fused SSD kernel is not importable")
    return ssd_chunked(x, dt, A, B, C, chunk_size_for(x.shape[1], chunk_size, x.device), initial_state)


def ssd_step(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence. state: (b, h, p, n); x: (b, h, p); dt: (b, h); B, C: (b, g, n).

    Returns (y: (b, h, p) in the dtype of x, new state in ``ssm_state_dtype``); the input
    state is not modified. The heads of a group share its B and C by broadcasting, not by
    copies: a decoding step is a handful of small operations, each paid for in overhead.
    The update runs in the state's dtype (float32 for half-precision inputs, as the chunked
    scan's state and mamba_ssm's step kernel): a bfloat16 state rounded at every token
    loses the small contributions of a long sequence.
    """
    batch, heads, head_dim, d_state = state.shape
    groups = B.shape[1]
    grouped = (batch, groups, heads // groups, head_dim, d_state)
    out_dtype, work = x.dtype, ssm_state_dtype(x.dtype)
    dt, x, B, C = dt.to(work), x.to(work), B.to(work), C.to(work)
    decay = torch.exp(dt * A).view(*grouped[:3], 1, 1)
    step_input = (dt.unsqueeze(-1) * x).view(*grouped[:4], 1)
    state = torch.addcmul(state.to(work).view(grouped) * decay, step_input, B.view(batch, groups, 1, 1, d_state))
    y = torch.matmul(state.view(batch, groups, -1, d_state), C.view(batch, groups, d_state, 1))
    return y.view(batch, heads, head_dim).to(out_dtype), state.view(batch, heads, head_dim, d_state)


def ssd_reference(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive token-by-token recurrence: the oracle for ``ssd_chunked``."""
    batch, length, heads, headdim = x.shape
    state = initial_state
    if state is None:
        state = x.new_zeros(batch, heads, headdim, B.shape[-1], dtype=ssm_state_dtype(x.dtype))
    ys = []
    for t in range(length):
        y, state = ssd_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t])
        ys.append(y)
    return torch.stack(ys, dim=1), state
