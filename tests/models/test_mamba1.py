"""Mamba1 models: the explicit and implicit models (the two inference modes, saving, Auto-class
loading). The selective scan and the mixer are tests/layers/test_mamba1.py."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from implicitlm.models import (
    ImplicitMambaForCausalLM,
    build_model,
    config_from_options,
    load_model,
)
from tests.layers.test_mamba1 import F64
from tests.support.models import assert_logits_close, assert_modes_agree, contractive_model, tiny_model, token_ids


# ---------------------------------------------------------------- models

VOCAB = 10  # padded to 16


SIZES = dict(architecture="mamba", vocab_size=VOCAB, hidden_size=8, num_hidden_layers=2, state_size=4)


def make_model(implicit: bool = True, seed: int = 0, **overrides) -> ImplicitMambaForCausalLM:
    return tiny_model(seed, **{**SIZES, "implicit": implicit, **overrides})


def converging_model(tol: float) -> ImplicitMambaForCausalLM:
    """A float64 implicit model whose iteration converges within the budget."""
    return contractive_model(**SIZES, implicit=True, fixed_point=dict(tol=tol, max_iter=400))


@pytest.mark.device
def test_explicit_sequential_equals_simultaneous(device):
    model = make_model(implicit=False).double().eval().to(device)
    ids = token_ids(2, 9, seed=1, vocab=VOCAB).to(device)
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
    model = converging_model(tol=1e-8).to(device)
    ids = token_ids(2, 7, seed=2, vocab=VOCAB).to(device)
    # Two solves of one fixed point to a relative residual of 1e-8: measured 4e-8 apart.
    assert_modes_agree(model, ids, relative=1e-6, batch_passes=10)


def test_parallel_prefill_then_recurrent_decoding_equals_a_sequential_run():
    model = converging_model(tol=1e-9)
    ids = token_ids(2, 9, seed=3, vocab=VOCAB)
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
    ids = token_ids(2, 6, seed=5, vocab=VOCAB).to(device)
    model(ids, labels=ids).loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all() and param.grad.abs().max() > 0, name


@pytest.mark.parametrize("implicit", [False, True], ids=["explicit", "implicit"])
def test_save_and_load_round_trip(tmp_path, implicit):
    model = make_model(implicit, seed=6, time_step_rank=3).eval()
    ids = token_ids(2, 6, seed=7, vocab=VOCAB)
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
