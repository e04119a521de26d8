"""Mamba2 mixer: the one-token step and the parallel form compute the same function."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm

from implicitlm.layers import Mamba2Dims, Mamba2Mixer, Mamba2State
from tests.support.mixers import (
    assert_step_leaves_its_state, assert_token_t_changes_no_earlier_output, mixer_inputs, randn, run_steps,
)

# Tiny tensors: a second intra-op thread only adds synchronisation cost on a shared CPU.


DIMS = Mamba2Dims(d_model=8, d_state=4, headdim=4, chunk_size=4, ngroups=2)  # 4 heads, 2 groups
BATCH, LENGTH = 2, 11  # 11: two full chunks and a partial one
TOL = dict(rtol=1e-10, atol=1e-10)  # float64 throughout; the two forms differ only by rounding


def make_mixer(seed: int, device: str = "cpu") -> Mamba2Mixer:
    torch.manual_seed(seed)
    return Mamba2Mixer(DIMS).double().to(device)


def assert_states_close(a: Mamba2State, b: Mamba2State) -> None:
    torch.testing.assert_close(a.conv, b.conv, **TOL)
    torch.testing.assert_close(a.ssm, b.ssm, **TOL)


@pytest.mark.device
@pytest.mark.parametrize("with_injection", [False, True], ids=["plain", "injected"])
def test_steps_match_parallel_from_zero_state(with_injection, device):
    mixer = make_mixer(seed=0, device=device)
    hidden, injection = mixer_inputs(DIMS, BATCH, LENGTH, with_injection, seed=1, device=device)

    out, state = mixer(hidden, injection)
    out_steps, state_steps = run_steps(
        mixer, hidden, injection, mixer.initial_state(BATCH, dtype=torch.float64, device=device)
    )

    assert out.shape == hidden.shape
    torch.testing.assert_close(out_steps, out, **TOL)
    assert_states_close(state_steps, state)


@pytest.mark.device
@pytest.mark.parametrize("with_injection", [False, True], ids=["plain", "injected"])
def test_steps_continue_a_parallel_prefix(with_injection, device):
    mixer = make_mixer(seed=3, device=device)
    hidden, injection = mixer_inputs(DIMS, BATCH, LENGTH, with_injection, seed=4, device=device)
    half = LENGTH // 2

    out_full, state_full = mixer(hidden, injection)
    out_head, mid = mixer(hidden[:, :half], None if injection is None else injection[:, :half])
    out_tail, state = run_steps(mixer, hidden[:, half:], None if injection is None else injection[:, half:], mid)

    assert mid.ssm.abs().max() > 0  # the steps really start from a non-zero state
    torch.testing.assert_close(torch.cat([out_head, out_tail], dim=1), out_full, **TOL)
    assert_states_close(state, state_full)


def test_parallel_continues_a_parallel_prefix():
    mixer = make_mixer(seed=6)
    hidden = randn(BATCH, LENGTH, DIMS.d_model, seed=7)
    out_full, state_full = mixer(hidden)
    out_head, mid = mixer(hidden[:, :3])
    out_tail, state = mixer(hidden[:, 3:], state=mid)
    torch.testing.assert_close(torch.cat([out_head, out_tail], dim=1), out_full, **TOL)
    assert_states_close(state, state_full)


def test_step_does_not_modify_its_state():
    prompt, token = randn(BATCH, 5, DIMS.d_model, seed=9), randn(BATCH, DIMS.d_model, seed=10)
    assert_step_leaves_its_state(make_mixer(seed=8), prompt, token)


@pytest.mark.parametrize("t", [3, 4, LENGTH - 1])  # both sides of a chunk boundary, and the end
def test_changing_token_t_leaves_earlier_outputs_unchanged(t):
    hidden, injection = mixer_inputs(DIMS, BATCH, LENGTH, with_injection=True, seed=12)
    assert_token_t_changes_no_earlier_output(make_mixer(seed=11), hidden, injection, t)


def test_weight_normed_mixer_steps_match_parallel():
    mixer = make_mixer(seed=16)
    for module in (mixer.in_proj, mixer.conv1d, mixer.out_proj):
        weight_norm(module, name="weight", dim=0)
        with torch.no_grad():
            module.parametrizations.weight.original0.mul_(0.5)
    hidden, injection = mixer_inputs(DIMS, BATCH, LENGTH, with_injection=True, seed=17)

    out, state = mixer(hidden, injection)
    out_steps, state_steps = run_steps(mixer, hidden, injection, mixer.initial_state(BATCH, dtype=torch.float64))

    torch.testing.assert_close(out_steps, out, **TOL)
    assert_states_close(state_steps, state)


def test_initialisation():
    dims = Mamba2Dims(d_model=64, d_state=4, headdim=2)  # 64 heads: enough draws to see the ranges
    torch.manual_seed(19)
    mixer = Mamba2Mixer(dims, dt_min=1e-3, dt_max=0.1, dt_init_floor=1e-4)

    dt = F.softplus(mixer.dt_bias.detach())
    A = -torch.exp(mixer.A_log.detach())
    # softplus(inverse_softplus(dt)) returns dt up to float32 rounding (relative 1e-5).
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    assert dt.max() / dt.min() > 10  # log-uniform over two decades, not a constant
    assert A.min() >= -16.0 * (1 + 1e-6) and A.max() <= -1.0 * (1 - 1e-6)
    assert torch.equal(mixer.D.detach(), torch.ones(dims.nheads))


def test_dt_initialisation_floor():
    dims = Mamba2Dims(d_model=64, d_state=4, headdim=2)
    torch.manual_seed(20)
    mixer = Mamba2Mixer(dims, dt_min=1e-6, dt_max=1e-3, dt_init_floor=1e-4)
    dt = F.softplus(mixer.dt_bias.detach())
    # Two thirds of a log-uniform draw over [1e-6, 1e-3] fall under the floor and are lifted to it.
    assert dt.min() >= 1e-4 * (1 - 1e-4) and dt.max() <= 1e-3 * (1 + 1e-5)
    assert (dt < 1e-4 * (1 + 1e-4)).sum() > dims.nheads // 3


def test_dims_reject_incompatible_sizes():
    with pytest.raises(ValueError, match="headdim"):
        Mamba2Dims(d_model=5, headdim=4)  # d_inner 10
    with pytest.raises(ValueError, match="ngroups"):
        Mamba2Dims(d_model=6, headdim=4, expand=2, ngroups=2)  # 3 heads, 2 groups
