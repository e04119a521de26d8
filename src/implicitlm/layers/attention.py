"""Causal self-attention with RoPE, grouped-query heads and an optional input injection.

The injection ``u`` (width q_dim + 2 * kv_dim) is split in three and added to the q, k
and v projections before RoPE, so in an implicit model queries, keys and values depend
on both the iterate z and the input x. The parallel form (``forward``) and the one-token
form (``step``) compute the same function; both return a new KV cache and never write
the one they were given, which is what the sequential fixed-point mode needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import OptionError
from .rotary import apply_rotary, rotary_cos_sin, rotary_cos_sin_at


@dataclass
class KVCache:
    """Rotated keys and values of every token so far, each (b, kv_heads, t, head_dim).

    ``real``: (b, t) bool, False at padding; None when every cached token is real.
    """

    keys: torch.Tensor
    values: torch.Tensor
    real: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Tokens cached, padding included."""
        return self.keys.shape[2]



@dataclass(frozen=True)
class AttentionDims:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float = 5e5

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise OptionError(f"hidden_size={self.hidden_size} is not a multiple of num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise OptionError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise OptionError(f"head_dim={self.head_dim} must be even: RoPE rotates pairs of dimensions")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def injection_size(self) -> int:
        """Width of the injection: [q, k, v]."""
        return self.q_dim + 2 * self.kv_dim


class CausalSelfAttention(nn.Module):
    """Projection names as in transformers' LlamaAttention, so its weights map one to one."""

    def __init__(self, dims: AttentionDims) -> None:
        super().__init__()
        self.dims = dims
        self.q_proj = nn.Linear(dims.hidden_size, dims.q_dim, bias=False)
        self.k_proj = nn.Linear(dims.hidden_size, dims.kv_dim, bias=False)
        self.v_proj = nn.Linear(dims.hidden_size, dims.kv_dim, bias=False)
        self.o_proj = nn.Linear(dims.q_dim, dims.hidden_size, bias=False)

    def initial_state(self, batch: int, device=None, dtype=None) -> KVCache:
        d = self.dims
        empty = torch.zeros(batch, d.num_kv_heads, 0, d.head_dim, device=device, dtype=dtype)
        return KVCache(keys=empty, values=empty)

    def forward(
        self, hidden: torch.Tensor, injection: torch.Tensor | None = None, state: KVCache | None = None,
        padding: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """hidden: (b, l, hidden_size); injection: (b, l, injection_size) or None; state: the
        cache of the tokens before the first one (none when None); padding: (b, l) bool, True
        at real tokens, or None. Returns (output, cache of every token so far).

        Padding tokens are invisible to every query and do not advance positions, so a
        left-padded sample gets the same outputs at its real tokens as without padding."""
        d = self.dims
        batch, length, _ = hidden.shape
        start = 0 if state is None else state.length
        real = _real_tokens(state, padding, batch, length, hidden.device)
        positions = None if real is None else _positions(real, length)
        q, k, v = self._project(hidden, injection, start, positions)
        if state is not None:
            k = torch.cat([state.keys, k], dim=2)
            v = torch.cat([state.values, v], dim=2)
        # Query i is token start + i and sees keys 0 .. start + i. From an empty cache that is
        # sdpa's causal mask; after a prefix, is_causal would align the triangle to the
        # top-left corner (query i seeing keys 0 .. i), so the mask is given explicitly.
        mask = None
        if real is not None or (start > 0 and length > 1):
            mask = torch.ones(length, start + length, dtype=torch.bool, device=hidden.device).tril(diagonal=start)
        if real is not None:
            # A query always sees itself, so a padding query has one key and no NaN row.
            cached = torch.zeros(length, start, dtype=torch.bool, device=hidden.device)
            itself = torch.cat([cached, torch.eye(length, dtype=torch.bool, device=hidden.device)], dim=1)
            mask = (mask & real[:, None, None, :]) | itself
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and start == 0, enable_gqa=d.num_kv_heads != d.num_heads
        )
        out = self.o_proj(y.transpose(1, 2).reshape(batch, length, d.q_dim))
        return out, KVCache(keys=k, values=v, real=real)

    def step(
        self, hidden: torch.Tensor, injection: torch.Tensor | None, state: KVCache
    ) -> tuple[torch.Tensor, KVCache]:
        """One token: hidden (b, hidden_size), injection (b, injection_size) or None; the
        token sits at position ``state.length`` and attends to every cached key and its own."""
        out, state = self(hidden[:, None], None if injection is None else injection[:, None], state)
        return out[:, 0], state

    @property
    def query_size(self) -> int:
        """Width of a query that reads the cache (``read_state``): one per head."""
        return self.dims.q_dim

    @property
    def readout_size(self) -> int:
        return self.dims.q_dim

    def read_state(self, state: KVCache, query: torch.Tensor) -> torch.Tensor:
        """``query`` (b, q_dim), unrotated, attending to every cached real token: (b, q_dim),
        in the cache's dtype; zeros from an empty cache. What a learned initial guess knows of
        the tokens before the one it guesses beyond the last fixed point."""
        visible = None if state.real is None else state.real[:, None, None, :]
        return self._read(query[:, None], state.keys, state.values, visible)[:, 0]

    def state_reader(
        self, hidden: torch.Tensor, injection: torch.Tensor | None = None, state: KVCache | None = None,
        padding: torch.Tensor | None = None,
    ):
        """queries (b, l, q_dim) -> (b, l, q_dim): ``read_state`` of every token's query
        against the cache before that token, the caches these inputs leave (``forward``'s),
        at once."""
        batch, length, _ = hidden.shape
        start = 0 if state is None else state.length
        real = _real_tokens(state, padding, batch, length, hidden.device)
        _, keys, values = self._project(hidden, injection, start, None if real is None else _positions(real, length))
        if state is not None:
            keys, values = torch.cat([state.keys, keys], dim=2), torch.cat([state.values, values], dim=2)
        # Query i (token start + i) sees the keys before it: 0 .. start + i - 1.
        visible = torch.ones(length, start + length, dtype=torch.bool, device=hidden.device).tril(diagonal=start - 1)
        if real is not None:
            visible = visible & real[:, None, None, :]
        return lambda queries: self._read(queries, keys, values, visible)

    def _read(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              visible: torch.Tensor | None) -> torch.Tensor:
        """(b, l, q_dim) queries attending to ``keys``/``values`` where ``visible`` (broadcast
        to (b, heads, l, keys)); a query that sees no key reads zeros."""
        d = self.dims
        batch, length, _ = queries.shape
        q = queries.reshape(batch, length, d.num_heads, d.head_dim).transpose(1, 2).to(keys.dtype)
        repeat = d.num_heads // d.num_kv_heads
        keys, values = keys.repeat_interleave(repeat, dim=1), values.repeat_interleave(repeat, dim=1)
        scores = q @ keys.transpose(-1, -2)
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * d.head_dim**-0.5
        if visible is None:
            visible = torch.ones_like(scores, dtype=torch.bool)
        sees_any = visible.any(dim=-1, keepdim=True)
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")).masked_fill(~sees_any, 0.0), dim=-1)
        read = (weights * sees_any).to(values.dtype) @ values
        return read.transpose(1, 2).reshape(batch, length, d.q_dim)

    def _project(
        self, hidden: torch.Tensor, injection: torch.Tensor | None, start: int, positions: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (b, heads, l, head_dim) and k, v (b, kv_heads, l, head_dim); q and k rotated."""
        d = self.dims
        q, k, v = self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)
        if injection is not None:
            u_q, u_k, u_v = torch.split(injection, [d.q_dim, d.kv_dim, d.kv_dim], dim=-1)
            q, k, v = q + u_q, k + u_k, v + u_v
        batch, length, _ = hidden.shape
        q = q.view(batch, length, d.num_heads, d.head_dim).transpose(1, 2)
        k = k.view(batch, length, d.num_kv_heads, d.head_dim).transpose(1, 2)
        v = v.view(batch, length, d.num_kv_heads, d.head_dim).transpose(1, 2)
        if positions is None:
            cos, sin = rotary_cos_sin(start, length, d.head_dim, d.rope_theta, hidden.device, hidden.dtype)
        else:
            cos, sin = rotary_cos_sin_at(positions, d.head_dim, d.rope_theta, hidden.dtype)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # one angle per sample, shared by heads
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


def _real_tokens(
    state: KVCache | None, padding: torch.Tensor | None, batch: int, length: int, device
) -> torch.Tensor | None:
    """(b, t + l) bool over cached and new tokens, or None when none of them is padding."""
    cached = None if state is None else state.real
    if cached is None and padding is None:
        return None
    if cached is None:
        cached = torch.ones(batch, 0 if state is None else state.length, dtype=torch.bool, device=device)
    if padding is None:
        padding = torch.ones(batch, length, dtype=torch.bool, device=device)
    return torch.cat([cached, padding.bool()], dim=1)


def _positions(real: torch.Tensor, length: int) -> torch.Tensor:
    """(b, l) positions of the new tokens: real tokens before each, padding not counted."""
    return (real.cumsum(dim=1) - 1).clamp(min=0)[:, -length:]
