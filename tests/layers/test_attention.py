"""Llama's layers: RoPE, and attention's step and parallel forms. The models are
tests/models/test_llama.py."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from implicitlm.layers import AttentionDims, CausalSelfAttention, KVCache, apply_rotary, rotary_cos_sin
from tests.support.mixers import randn, run_steps

# Tiny tensors: a second intra-op thread only adds synchronisation cost on a shared CPU.

THETA = 5e5
F64 = dict(rtol=1e-10, atol=1e-10)  # float64: the forms compared differ by rounding only


# ---------------------------------------------------------------- RoPE


def rotate(x: torch.Tensor, position: int) -> torch.Tensor:
    cos, sin = rotary_cos_sin(position, 1, x.shape[-1], THETA, dtype=x.dtype)
    return apply_rotary(x, cos, sin)


def test_rotary_score_depends_only_on_the_distance():
    q, k = randn(1, 8, seed=0), randn(1, 8, seed=1)
    for m, n in [(5, 2), (2, 5), (7, 7)]:
        score = (rotate(q, m) * rotate(k, n)).sum()
        for shift in (1, 13, 1000):
            shifted = (rotate(q, m + shift) * rotate(k, n + shift)).sum()
            torch.testing.assert_close(shifted, score, **F64)
    # ... and does depend on it: the rotation is not the identity.
    assert abs((rotate(q, 3) * rotate(k, 0)).sum() - (q * k).sum()) > 1e-3


@pytest.mark.parametrize("start", [0, 1, 1000])
def test_rotary_matches_transformers(start):
    head_dim, heads, length = 8, 4, 5
    config = LlamaConfig(
        hidden_size=head_dim * heads,
        num_attention_heads=heads,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
    )
    q = randn(2, heads, length, head_dim, seed=2, dtype=torch.float32)
    k = randn(2, heads, length, head_dim, seed=3, dtype=torch.float32)
    positions = torch.arange(start, start + length)[None]
    cos_hf, sin_hf = LlamaRotaryEmbedding(config)(q, positions)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos_hf, sin_hf)

    cos, sin = rotary_cos_sin(start, length, head_dim, THETA, dtype=torch.float32)
    torch.testing.assert_close(apply_rotary(q, cos, sin), q_hf, rtol=0, atol=1e-6)
    torch.testing.assert_close(apply_rotary(k, cos, sin), k_hf, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- attention

HIDDEN, HEADS, BATCH, LENGTH = 16, 4, 2, 7


def make_attention(kv_heads: int, seed: int) -> CausalSelfAttention:
    torch.manual_seed(seed)
    return CausalSelfAttention(AttentionDims(HIDDEN, HEADS, kv_heads, rope_theta=THETA)).double()


def assert_caches_close(a: KVCache, b: KVCache) -> None:
    torch.testing.assert_close(a.keys, b.keys, **F64)
    torch.testing.assert_close(a.values, b.values, **F64)


ATTENTION_CASES = pytest.mark.parametrize(
    "kv_heads, with_injection",
    [(HEADS, False), (HEADS, True), (2, False), (2, True)],
    ids=["plain", "injected", "gqa", "gqa-injected"],
)


def inputs(attention: CausalSelfAttention, with_injection: bool, seed: int):
    hidden = randn(BATCH, LENGTH, HIDDEN, seed=seed)
    injection = randn(BATCH, LENGTH, attention.dims.injection_size, seed=seed + 1) if with_injection else None
    return hidden, injection


def head(x: torch.Tensor | None, end: int) -> torch.Tensor | None:
    return None if x is None else x[:, :end]


def tail(x: torch.Tensor | None, start: int) -> torch.Tensor | None:
    return None if x is None else x[:, start:]


@pytest.mark.device
@ATTENTION_CASES
def test_attention_steps_match_parallel(kv_heads, with_injection, device):
    attention = make_attention(kv_heads, seed=0).to(device)
    hidden, injection = (None if t is None else t.to(device) for t in inputs(attention, with_injection, seed=1))

    out, cache = attention(hidden, injection)
    empty = attention.initial_state(BATCH, device=device, dtype=torch.float64)
    out_steps, cache_steps = run_steps(attention, hidden, injection, empty)

    assert out.shape == hidden.shape and cache.keys.shape == (BATCH, kv_heads, LENGTH, HIDDEN // HEADS)
    torch.testing.assert_close(out_steps, out, **F64)
    assert_caches_close(cache_steps, cache)


@ATTENTION_CASES
def test_attention_continues_a_non_empty_cache(kv_heads, with_injection):
    attention = make_attention(kv_heads, seed=2)
    hidden, injection = inputs(attention, with_injection, seed=3)
    split = 3
    out_full, cache_full = attention(hidden, injection)
    out_head, prefix = attention(head(hidden, split), head(injection, split))

    out_parallel, cache_parallel = attention(tail(hidden, split), tail(injection, split), prefix)
    out_steps, cache_steps = run_steps(attention, tail(hidden, split), tail(injection, split), prefix)

    assert prefix.length == split  # the given cache is left as it was
    for out_tail, cache in [(out_parallel, cache_parallel), (out_steps, cache_steps)]:
        torch.testing.assert_close(torch.cat([out_head, out_tail], dim=1), out_full, **F64)
        assert_caches_close(cache, cache_full)


def test_attention_is_causal():
    attention = make_attention(kv_heads=2, seed=4)
    hidden, injection = inputs(attention, with_injection=True, seed=5)
    t = 4
    changed_hidden, changed_injection = hidden.clone(), injection.clone()
    changed_hidden[:, t] += 1.0
    changed_injection[:, t] += 1.0

    out = attention(hidden, injection)[0]
    changed = attention(changed_hidden, changed_injection)[0]

    torch.testing.assert_close(changed[:, :t], out[:, :t], rtol=0, atol=0)
    assert (changed[:, t:] - out[:, t:]).abs().amax(dim=-1).min() > 1e-6


def test_attention_rejects_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="num_kv_heads"):
        AttentionDims(16, 4, 3)
    with pytest.raises(ValueError, match="num_heads"):
        AttentionDims(18, 4, 4)


def test_unpadded_parallel_attention_takes_the_flash_eligible_call(monkeypatch):
    # On CUDA, sdpa's flash kernel takes is_causal without an explicit mask; a mask would
    # send the call to a slower kernel. Training and prefill from an empty cache must ask
    # for exactly that call.
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    attention = make_attention(2, seed=0)
    hidden, injection = inputs(attention, True, seed=1)
    attention(hidden, injection)
    assert calls == [(None, True)]


@ATTENTION_CASES
def test_sdpas_unmasked_causal_path_equals_the_masked_one(kv_heads, with_injection):
    """The flash-eligible call (no mask, is_causal) and the explicit-mask call that padding
    takes give the same outputs when nothing is padded, in float64 and in float32."""
    attention = make_attention(kv_heads, seed=0)
    hidden, injection = inputs(attention, with_injection, seed=1)
    everything_real = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    unmasked, cache = attention(hidden, injection)
    masked, masked_cache = attention(hidden, injection, padding=everything_real)
    torch.testing.assert_close(masked, unmasked, **F64)
    assert_caches_close(masked_cache, cache)
    single = attention.float()
    as_float = [None if t is None else t.float() for t in (hidden, injection)]
    torch.testing.assert_close(single(*as_float, padding=everything_real)[0], single(*as_float)[0],
                               rtol=1e-5, atol=1e-6)
