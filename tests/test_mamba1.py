"""Mamba1: the chunked selective scan against the token-by-token recurrence, the mixer's
parallel and one-token forms, and the explicit and implicit models (the two inference
modes, saving, Auto-class loading)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from contractive import make_contractive
from implicitlm.layers import Mamba1Dims, Mamba1Mixer, selective_scan_chunked, selective_scan_reference
from implicitlm.models import (
    ImplicitMambaConfig,
    ImplicitMambaForCausalLM,
    build_model,
    config_from_options,
    load_model,
)
from test_mamba2_layer import assert_states_close, run_steps  # any mixer's: step and a (conv, ssm) state
from test_models import assert_logits_close

F64 = dict(rtol=1e-10, atol=1e-10)  # float64: the forms compared differ by rounding only


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


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


def mixer_inputs(with_injection: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    injection = randn(BATCH, LENGTH, DIMS.d_in_proj, seed=seed + 1) if with_injection else None
    return randn(BATCH, LENGTH, DIMS.d_model, seed=seed), injection


@pytest.mark.device
@pytest.mark.parametrize("with_injection", [False, True], ids=["plain", "injected"])
def test_mixer_steps_match_parallel(with_injection, device):
    mixer = make_mixer(seed=0).to(device)
    hidden, injection = (None if t is None else t.to(device) for t in mixer_inputs(with_injection, seed=1))

    out, state = mixer(hidden, injection)
    empty = mixer.initial_state(BATCH, device=device, dtype=torch.float64)
    out_steps, state_steps = run_steps(mixer, hidden, injection, empty)

    assert out.shape == hidden.shape
    torch.testing.assert_close(out_steps, out, **F64)
    assert_states_close(state_steps, state)


@pytest.mark.parametrize("split", [3, 4, 7])
def test_mixer_continues_from_a_state(split):
    mixer = make_mixer(seed=3)
    hidden, injection = mixer_inputs(with_injection=True, seed=4)
    out_full, state_full = mixer(hidden, injection)
    out_head, mid = mixer(hidden[:, :split], injection[:, :split])

    out_parallel, state_parallel = mixer(hidden[:, split:], injection[:, split:], mid)
    out_steps, state_steps = run_steps(mixer, hidden[:, split:], injection[:, split:], mid)

    assert mid.ssm.abs().max() > 0  # a genuine, non-zero state to continue from
    for out_tail, state in [(out_parallel, state_parallel), (out_steps, state_steps)]:
        torch.testing.assert_close(torch.cat([out_head, out_tail], dim=1), out_full, **F64)
        assert_states_close(state, state_full)


def test_step_does_not_modify_its_state():
    mixer = make_mixer(seed=6)
    _, state = mixer(randn(BATCH, 5, DIMS.d_model, seed=7))
    conv, ssm = state.conv.clone(), state.ssm.clone()
    mixer.step(randn(BATCH, DIMS.d_model, seed=8), None, state)
    assert torch.equal(state.conv, conv) and torch.equal(state.ssm, ssm)


def test_left_padding_leaves_outputs_and_state_unchanged():
    mixer = make_mixer(seed=9)
    hidden, injection = mixer_inputs(with_injection=True, seed=10)
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
    mixer = make_mixer(seed=11)
    hidden, injection = mixer_inputs(with_injection=True, seed=12)
    changed_hidden, changed_injection = hidden.clone(), injection.clone()
    changed_hidden[:, t] += 1.0
    changed_injection[:, t] -= 1.0

    out, _ = mixer(hidden, injection)
    out_changed, _ = mixer(changed_hidden, changed_injection)

    assert torch.equal(out_changed[:, :t], out[:, :t])
    assert (out_changed[:, t] - out[:, t]).abs().max() > 1e-3


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


# ---------------------------------------------------------------- models

VOCAB = 10  # padded to 16


def make_model(implicit: bool = True, seed: int = 0, **overrides) -> ImplicitMambaForCausalLM:
    values = dict(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=2, state_size=4, implicit=implicit)
    values.update(overrides)
    torch.manual_seed(seed)
    return ImplicitMambaForCausalLM(ImplicitMambaConfig(**values))


def contractive_model(tol: float) -> ImplicitMambaForCausalLM:
    """A float64 implicit model whose iteration converges within the budget."""
    return make_contractive(make_model(fixed_point=dict(tol=tol, max_iter=400)).double().eval())


def token_ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.device
def test_explicit_sequential_equals_simultaneous(device):
    model = make_model(implicit=False).double().eval().to(device)
    ids = token_ids(2, 9, seed=1).to(device)
    with torch.no_grad():
        parallel = model(ids, use_cache=True)
        sequential = model(ids, mode="sequential")
    assert parallel.fixed_point is None and sequential.fixed_point is None
    assert_logits_close(sequential.logits, parallel.logits, relative=1e-9)
    for step_state, parallel_state in zip(sequential.state, parallel.state):
        torch.testing.assert_close(step_state.ssm, parallel_state.ssm, **F64)
        torch.testing.assert_close(step_state.conv, parallel_state.conv, **F64)


@pytest.mark.device
def test_simultaneous_and_sequential_reach_the_same_fixed_point(device):
    model = contractive_model(tol=1e-8).to(device)
    ids = token_ids(2, 7, seed=2).to(device)
    with torch.no_grad():
        parallel = model(ids, mode="simultaneous")
        sequential = model(ids, mode="sequential")

    assert parallel.fixed_point.converged.all() and sequential.fixed_point.converged.all()
    assert sequential.fixed_point.iterations.shape == (2, 7)
    assert parallel.fixed_point.evaluations > 10  # a genuine iteration, not a one-step map
    # Two solves of one fixed point to a relative residual of 1e-8: measured 4e-8 apart.
    assert_logits_close(sequential.logits, parallel.logits, relative=1e-6)


def test_parallel_prefill_then_recurrent_decoding_equals_a_sequential_run():
    model = contractive_model(tol=1e-9)
    ids = token_ids(2, 9, seed=3)
    with torch.no_grad():
        reference = model(ids, mode="sequential")
        prefill = model(ids[:, :5], use_cache=True)
        decoded = model(ids[:, 5:], mode="sequential", state=prefill.state)
    # Logits of order 0.2, solved to a relative residual of 1e-9: measured 3e-10 apart.
    torch.testing.assert_close(torch.cat([prefill.logits, decoded.logits], dim=1), reference.logits, rtol=0, atol=1e-8)


@pytest.mark.device
@pytest.mark.parametrize("implicit", [False, True], ids=["explicit", "implicit"])
def test_gradient_reaches_every_parameter(implicit, device):
    model = make_model(implicit, seed=4, fixed_point=dict(train_max_iter=2, phantom_steps=1)).train().to(device)
    ids = token_ids(2, 6, seed=5).to(device)
    model(ids, labels=ids).loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all() and param.grad.abs().max() > 0, name


@pytest.mark.parametrize("implicit", [False, True], ids=["explicit", "implicit"])
def test_save_and_load_round_trip(tmp_path, implicit):
    model = make_model(implicit, seed=6, time_step_rank=3).eval()
    ids = token_ids(2, 6, seed=7)
    model.save_pretrained(tmp_path)

    for reloaded in (load_model(tmp_path), AutoModelForCausalLM.from_pretrained(tmp_path).eval()):
        assert type(reloaded) is ImplicitMambaForCausalLM and reloaded.config.time_step_rank == 3
        with torch.no_grad():
            assert torch.equal(reloaded(ids).logits, model(ids).logits)


def test_options_pick_the_architecture_and_resolve_the_time_step_rank():
    model = build_model(config_from_options({"architecture": "mamba", "vocab_size": VOCAB, "hidden_size": 40,
                                             "num_hidden_layers": 1, "state_size": 4}))
    assert type(model) is ImplicitMambaForCausalLM and model.config.model_type == "implicit_mamba"
    assert model.config.time_step_rank == math.ceil(40 / 16) == model.stack.layers[0].mixer.dt_proj.in_features
    with pytest.raises(ValueError, match="unknown model option 'head_dim'"):
        config_from_options({"architecture": "mamba", "head_dim": 4})  # a Mamba2 option
