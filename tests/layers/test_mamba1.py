"""Mamba1's layers: the chunked selective scan against the token-by-token recurrence, and the
mixer's parallel and one-token forms. The models are tests/models/test_mamba1.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from implicitlm.layers import Mamba1Dims, Mamba1Mixer, selective_scan_chunked, selective_scan_reference
from tests.layers.test_mamba2 import assert_states_close  # any mixer's (conv, ssm) state
from tests.support.mixers import (
    assert_step_leaves_its_state, assert_token_t_changes_no_earlier_output, mixer_inputs, randn, run_steps,
)

F64 = dict(rtol=1e-10, atol=1e-10)  # float64: the forms compared differ by rounding only


# ---------------------------------------------------------------- selective scan

CHANNELS, STATE, CHUNK = 6, 4, 4


def scan_inputs(batch: int, length: int, seed: int) -> tuple[torch.Tensor, ...]:
    """x, dt (positive), A (negative), B, C in float64."""
    x = randn(batch, length, CHANNELS, seed=seed)
    B, C = randn(batch, length, STATE, seed=seed + 1), randn(batch, length, STATE, seed=seed + 2)
    dt = F.softplus(randn(batch, length, CHANNELS, seed=seed + 3))
    A = -torch.exp(randn(CHANNELS, STATE, seed=seed + 4))
    return x, dt, A, B, C


@pytest.mark.parametrize("length", [1, 3, 4, 11, 16])  # inside one chunk, whole chunks, and a partial last one
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_chunked_scan_matches_the_recurrence(length, with_state):
    x, dt, A, B, C = scan_inputs(2, length, seed=0)
    state = randn(2, CHANNELS, STATE, seed=5) if with_state else None

    y, final = selective_scan_chunked(x, dt, A, B, C, chunk_size=CHUNK, initial_state=state)
    y_expected, final_expected = selective_scan_reference(x, dt, A, B, C, initial_state=state)

    assert y.shape == x.shape and final.shape == (2, CHANNELS, STATE)
    torch.testing.assert_close(y, y_expected, **F64)
    torch.testing.assert_close(final, final_expected, **F64)


def test_chunked_scan_stays_exact_under_any_strength_of_decay():
    # Per-token log-decays from -5e-6 to -1.3e4: a chunk's exp(-cumsum) would overflow even
    # in float64, and a difference of its cumsums would cancel. Float32 against float64.
    x, dt, A, B, C = scan_inputs(2, 11, seed=6)
    dt = dt * torch.exp(randn(2, 11, CHANNELS, seed=11) * 4)
    y, final = selective_scan_chunked(*(t.float() for t in (x, dt, A, B, C)), chunk_size=CHUNK)
    y_expected, final_expected = selective_scan_reference(x, dt, A, B, C)
    assert (dt[..., None] * A).min() < -1e3
    torch.testing.assert_close(y, y_expected.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, final_expected.float(), rtol=1e-5, atol=1e-5)


def test_chunked_scan_gradients_match_the_recurrence():
    inputs = [t.requires_grad_() for t in (*scan_inputs(2, 7, seed=12), randn(2, CHANNELS, STATE, seed=17))]
    x, dt, A, B, C, state = inputs
    weights = randn(2, 7, CHANNELS, seed=18)

    def loss(scan, **chunking) -> torch.Tensor:
        y, final = scan(x, dt, A, B, C, initial_state=state, **chunking)
        return (y * weights).sum() + final.square().sum()

    grads = torch.autograd.grad(loss(selective_scan_chunked, chunk_size=3), inputs)
    expected = torch.autograd.grad(loss(selective_scan_reference), inputs)
    for name, grad, grad_expected in zip("x dt A B C state".split(), grads, expected):
        torch.testing.assert_close(grad, grad_expected, **F64, msg=name)


# ---------------------------------------------------------------- mixer

DIMS = Mamba1Dims(d_model=8, dt_rank=2, d_state=4, chunk_size=CHUNK)  # d_inner 16
BATCH, LENGTH = 2, 11  # 11: two full chunks and a partial one


def make_mixer(seed: int) -> Mamba1Mixer:
    torch.manual_seed(seed)
    return Mamba1Mixer(DIMS).double()


@pytest.mark.device
@pytest.mark.parametrize("with_injection", [False, True], ids=["plain", "injected"])
def test_mixer_steps_match_parallel(with_injection, device):
    mixer = make_mixer(seed=0).to(device)
    hidden, injection = mixer_inputs(DIMS, BATCH, LENGTH, with_injection, seed=1, device=device)

    out, state = mixer(hidden, injection)
    empty = mixer.initial_state(BATCH, device=device, dtype=torch.float64)
    out_steps, state_steps = run_steps(mixer, hidden, injection, empty)

    assert out.shape == hidden.shape
    torch.testing.assert_close(out_steps, out, **F64)
    assert_states_close(state_steps, state)


@pytest.mark.parametrize("split", [3, 4, 7])
def test_mixer_continues_from_a_state(split):
    mixer = make_mixer(seed=3)
    hidden, injection = mixer_inputs(DIMS, BATCH, LENGTH, with_injection=True, seed=4)
    out_full, state_full = mixer(hidden, injection)
    out_head, mid = mixer(hidden[:, :split], injection[:, :split])

    out_parallel, state_parallel = mixer(hidden[:, split:], injection[:, split:], mid)
    out_steps, state_steps = run_steps(mixer, hidden[:, split:], injection[:, split:], mid)

    assert mid.ssm.abs().max() > 0  # a genuine, non-zero state to continue from
    for out_tail, state in [(out_parallel, state_parallel), (out_steps, state_steps)]:
        torch.testing.assert_close(torch.cat([out_head, out_tail], dim=1), out_full, **F64)
        assert_states_close(state, state_full)


def test_step_does_not_modify_its_state():
    prompt, token = randn(BATCH, 5, DIMS.d_model, seed=7), randn(BATCH, DIMS.d_model, seed=8)
    assert_step_leaves_its_state(make_mixer(seed=6), prompt, token)


def test_left_padding_leaves_outputs_and_state_unchanged():
    mixer = make_mixer(seed=9)
    hidden, injection = mixer_inputs(DIMS, BATCH, LENGTH, with_injection=True, seed=10)
    pad = 5  # more than the conv's window
    padding = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    padding[0, :pad] = False

    out, state = mixer(hidden, injection, padding=padding)
    out_alone, state_alone = mixer(hidden[:1, pad:], injection[:1, pad:])
    out_full, _ = mixer(hidden[1:], injection[1:])

    torch.testing.assert_close(out[0, pad:], out_alone[0], **F64)
    torch.testing.assert_close(out[1], out_full[0], **F64)
    torch.testing.assert_close(state.ssm[:1], state_alone.ssm, **F64)
    torch.testing.assert_close(state.conv[:1], state_alone.conv, **F64)


@pytest.mark.parametrize("t", [3, 4, LENGTH - 1])  # both sides of a chunk boundary, and the end
def test_changing_token_t_leaves_earlier_outputs_unchanged(t):
    hidden, injection = mixer_inputs(DIMS, BATCH, LENGTH, with_injection=True, seed=12)
    assert_token_t_changes_no_earlier_output(make_mixer(seed=11), hidden, injection, t)


def test_initialisation_follows_mamba_ssm():
    dims = Mamba1Dims(d_model=64, dt_rank=4, d_state=16)  # 128 channels: enough draws to see the ranges
    torch.manual_seed(13)
    mixer = Mamba1Mixer(dims, dt_min=1e-3, dt_max=0.1, dt_init_floor=1e-4)

    expected_A = -torch.arange(1.0, 17.0).expand(dims.d_inner, -1)
    torch.testing.assert_close(-torch.exp(mixer.A_log.detach()), expected_A, rtol=1e-6, atol=0)
    assert torch.equal(mixer.D.detach(), torch.ones(dims.d_inner))
    dt = F.softplus(mixer.dt_proj.bias.detach())
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5) and dt.max() / dt.min() > 10
    weight = mixer.dt_proj.weight.detach()
    assert weight.abs().max() <= dims.dt_rank**-0.5 and weight.abs().max() > 0.9 * dims.dt_rank**-0.5
    assert mixer.x_proj.out_features == dims.dt_rank + 2 * dims.d_state and mixer.in_proj.out_features == 256
