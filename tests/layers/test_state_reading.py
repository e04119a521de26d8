"""Reading a mixer's state with a query (what a learned initial guess knows of the tokens
before the one it guesses): the parallel form (``state_reader``, every token at once) equals
``read_state`` of the state before each token, as the one-token steps leave it; it reads
what the state holds, ignores left padding and passes gradients to the queries."""

from __future__ import annotations

import pytest
import torch

from implicitlm.layers import AttentionDims, CausalSelfAttention, Mamba1Dims, Mamba1Mixer, Mamba2Dims, Mamba2Mixer

BATCH, PREFIX, LENGTH = 2, 5, 9  # 9 tokens: two chunks of 4 and one token more
TOL = dict(rtol=1e-10, atol=1e-10)  # float64: the forms differ by rounding only
MIXERS = {
    "mamba2": lambda: Mamba2Mixer(Mamba2Dims(d_model=8, d_state=4, headdim=4, chunk_size=4, ngroups=2)),
    "mamba1": lambda: Mamba1Mixer(Mamba1Dims(d_model=8, dt_rank=2, d_state=4, chunk_size=4)),
    "attention": lambda: CausalSelfAttention(AttentionDims(16, 4, 4)),
    "attention-gqa": lambda: CausalSelfAttention(AttentionDims(16, 4, 2)),
}


def make(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    return MIXERS[kind]().double()


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def inputs(mixer, length: int, seed: int):
    width = mixer.dims.hidden_size if isinstance(mixer, CausalSelfAttention) else mixer.dims.d_model
    injection_size = mixer.dims.injection_size if isinstance(mixer, CausalSelfAttention) else mixer.dims.d_in_proj
    return randn(BATCH, length, width, seed=seed), randn(BATCH, length, injection_size, seed=seed + 1)


def stepped_reads(mixer, hidden, injection, state, queries) -> torch.Tensor:
    """read_state before each token, the state advanced by the one-token step."""
    reads = []
    for t in range(hidden.shape[1]):
        reads.append(mixer.read_state(state, queries[:, t]))
        _, state = mixer.step(hidden[:, t], injection[:, t], state)
    return torch.stack(reads, dim=1)


@pytest.mark.parametrize("kind", list(MIXERS))
@pytest.mark.parametrize("prefix", [False, True], ids=["fresh", "after-prefix"])
def test_parallel_reads_equal_the_steps(kind, prefix):
    mixer = make(kind)
    hidden, injection = inputs(mixer, LENGTH, seed=1)
    queries = randn(BATCH, LENGTH, mixer.query_size, seed=3)
    state = None
    if prefix:
        _, state = mixer(*inputs(mixer, PREFIX, seed=4))
    parallel = mixer.state_reader(hidden, injection, state)(queries)
    start = mixer.initial_state(BATCH, dtype=torch.float64) if state is None else state
    stepped = stepped_reads(mixer, hidden, injection, start, queries)
    assert parallel.shape == (BATCH, LENGTH, mixer.readout_size)
    torch.testing.assert_close(parallel, stepped, **TOL)
    # The first token of a fresh sequence has nothing before it; every later one reads something.
    assert (parallel[:, 0].abs().max() > 0.01) == prefix
    assert parallel[:, 1:].abs().amin(dim=-1).gt(0).float().mean() > 0.5


@pytest.mark.parametrize("kind", list(MIXERS))
def test_reads_depend_on_the_state_and_the_query(kind):
    mixer = make(kind)
    _, state = mixer(*inputs(mixer, PREFIX, seed=4))
    _, other = mixer(*inputs(mixer, PREFIX, seed=6))
    query = randn(BATCH, mixer.query_size, seed=3)
    read = mixer.read_state(state, query)
    assert (read - mixer.read_state(other, query)).norm() > 0.1 * read.norm()
    assert (read - mixer.read_state(state, 2 * query + 1)).norm() > 0.1 * read.norm()


@pytest.mark.parametrize("kind", list(MIXERS))
def test_left_padding_leaves_the_reads_unchanged(kind):
    mixer = make(kind)
    hidden, injection = inputs(mixer, LENGTH, seed=1)
    queries = randn(BATCH, LENGTH, mixer.query_size, seed=3)
    pad = 3
    padded = [torch.cat([randn(BATCH, pad, x.shape[-1], seed=9), x], dim=1) for x in (hidden, injection, queries)]
    padding = torch.ones(BATCH, pad + LENGTH, dtype=torch.bool)
    padding[:, :pad] = False
    reads = mixer.state_reader(padded[0], padded[1], None, padding)(padded[2])
    torch.testing.assert_close(reads[:, pad:], mixer.state_reader(hidden, injection)(queries), **TOL)


@pytest.mark.parametrize("kind", list(MIXERS))
def test_reads_pass_gradients_to_the_queries(kind):
    mixer = make(kind).requires_grad_(False)
    hidden, injection = inputs(mixer, 5, seed=1)
    _, state = mixer(*inputs(mixer, 3, seed=4))
    read = mixer.state_reader(hidden, injection, state)
    queries = randn(BATCH, 5, mixer.query_size, seed=3).requires_grad_(True)
    assert torch.autograd.gradcheck(read, (queries,))
