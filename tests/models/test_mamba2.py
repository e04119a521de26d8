"""Implicit and explicit Mamba2 language models: the two inference modes, losses, training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support.models import (
    assert_logits_close, assert_modes_agree, contractive_model, tiny_model, token_ids, with_stack,
)
from implicitlm.data.words import prefix_products
from implicitlm.deq import OptionError
from implicitlm.models import ImplicitMamba2Config, ImplicitMamba2ForCausalLM

# Tiny tensors: a second intra-op thread only adds synchronisation cost on a shared CPU.


VOCAB = 6  # padded to 16


SIZES = dict(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=2, state_size=4, head_dim=4, expand=2, chunk_size=4)


def make_config(implicit: bool = True, **overrides) -> ImplicitMamba2Config:
    return ImplicitMamba2Config(**{**SIZES, "implicit": implicit, **overrides})


def make_model(implicit: bool = True, seed: int = 0, **overrides) -> ImplicitMamba2ForCausalLM:
    return tiny_model(seed, architecture="mamba2", **{**SIZES, "implicit": implicit, **overrides})


def converging_model(tol: float) -> ImplicitMamba2ForCausalLM:
    """A float64 implicit model whose iteration converges within the budget."""
    return contractive_model(architecture="mamba2", **SIZES, implicit=True, fixed_point=dict(tol=tol, max_iter=400))


# ---------------------------------------------------------------- the two modes


@pytest.mark.slow
@pytest.mark.device
def test_simultaneous_and_sequential_reach_the_same_fixed_point(device):
    # 1e-6: reached within the budget by the contractive model, tight enough for 1e-3 agreement.
    tol = 1e-6
    model = converging_model(tol).to(device)
    ids = token_ids(2, 7, seed=1, vocab=VOCAB).to(device)
    # Each solution is within |f(z) - z| / (1 - c) of z*, and this pre-norm residual map
    # contracts slowly (c ~ 0.95): 1e-3 of the logit scale leaves a margin over 20 * tol.
    parallel, _ = assert_modes_agree(model, ids, relative=1e-3, batch_passes=20)
    assert parallel.fixed_point.passes.shape == (2,)


@pytest.mark.device
def test_explicit_sequential_equals_simultaneous(device):
    model = make_model(implicit=False).double().eval().to(device)
    ids = token_ids(2, 9, seed=2, vocab=VOCAB).to(device)
    with torch.no_grad():
        parallel = model(ids)
        sequential = model(ids, mode="sequential")
    assert parallel.fixed_point is None and sequential.fixed_point is None
    # One pass each, in float64: they differ by rounding only.
    assert_logits_close(sequential.logits, parallel.logits, relative=1e-9)
    for step_state, parallel_state in zip(sequential.state, model.stack(model.embeddings(ids), None)[1]):
        torch.testing.assert_close(step_state.ssm, parallel_state.ssm, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(step_state.conv, parallel_state.conv, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_sequential_stop_is_per_sample():
    tol = 1e-5
    model = converging_model(tol)
    ids = token_ids(3, 6, seed=3, vocab=VOCAB)
    with torch.no_grad():
        alone = model(ids[:1], mode="sequential")
        batch = model(ids, mode="sequential")

    # Every token of every sample meets the tolerance on its own residual, whatever the
    # rest of the batch does ...
    assert batch.fixed_point.converged.all() and alone.fixed_point.converged.all()
    assert batch.fixed_point.passes.shape == (3, 6)
    # ... so a sample's logits change only by the refinement of extra steps: within
    # tol / (1 - c) ~ 20 * tol of the fixed point either way (see the test above).
    assert_logits_close(batch.logits[:1], alone.logits, relative=1e-3)


def test_budget_of_one_step_is_one_application_of_the_stack_from_zero():
    model = make_model(fixed_point=dict(max_iter=50, tol=1e-9)).double().eval()
    ids = token_ids(2, 5, seed=4, vocab=VOCAB)
    with torch.no_grad():
        embedded = model.embeddings(ids)
        injection = model.injection(model.injection_norm(embedded))
        z1, _ = model.stack(torch.zeros_like(embedded), injection)
        expected = F.linear(z1, model.embeddings.weight)[..., :VOCAB]

        one_step = model(ids, max_iter=1)
        model.set_fixed_point_options(max_iter=1)
        configured = model(ids)

    assert one_step.fixed_point.batch_passes == 1 and configured.fixed_point.batch_passes == 1
    assert model.config.fixed_point["max_iter"] == 1
    torch.testing.assert_close(one_step.logits, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(configured.logits, expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- logits and losses


def test_logits_are_sliced_to_the_vocabulary():
    model = make_model().eval()
    ids = token_ids(2, 5, seed=5, vocab=VOCAB)
    with torch.no_grad():
        out = model(ids, labels=ids)
    assert model.config.padded_vocab_size == 16 and model.embeddings.num_embeddings == 16
    assert out.logits.shape == (2, 5, VOCAB)
    assert torch.isfinite(out.loss)


class FixedOutputStack(nn.Module):
    """A backbone that ignores its input and returns a given final hidden state."""

    def __init__(self, z: torch.Tensor) -> None:
        super().__init__()
        self.z = z
        self.gradient_checkpointing = False

    def forward(self, z, injection, states=None, padding=None):
        return self.z, None


def oracle_model(labels: torch.Tensor, alignment: str) -> ImplicitMamba2ForCausalLM:
    """An explicit model whose logit at position t is 1e4 on labels[t] and 0 elsewhere:
    identity embeddings (hidden size = padded vocabulary) under a stack returning 1e4 * one-hot."""
    model = make_model(implicit=False, hidden_size=16, label_alignment=alignment)
    with torch.no_grad():
        model.embeddings.weight.copy_(torch.eye(16))
    return with_stack(model, FixedOutputStack(1e4 * F.one_hot(labels, 16).float()))


def test_aligned_loss_is_zero_for_the_true_prefix_products():
    inputs = token_ids(4, 12, seed=6, vocab=VOCAB)  # S3 has 6 elements: the vocabulary
    labels = torch.from_numpy(prefix_products("S3", inputs.numpy()).astype("int64"))

    aligned = oracle_model(labels, "aligned")(inputs, labels=labels)
    shifted = oracle_model(labels, "shifted")(inputs, labels=labels)

    assert aligned.loss.item() == 0.0
    # Shifted, position t is scored against the product up to t + 1: wrong wherever token
    # t + 1 is not the identity, at a cost of ~1e4 per wrong position.
    assert shifted.loss.item() > 1e3


def test_shifted_loss_is_next_token_cross_entropy():
    model = make_model(implicit=False, seed=7).eval()
    ids = token_ids(3, 8, seed=8, vocab=VOCAB)
    labels = ids.clone()
    labels[0, 3] = -100  # ignored position
    with torch.no_grad():
        out = model(ids, labels=labels)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
    unshifted = F.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected, rtol=1e-6, atol=0)
    assert abs(out.loss.item() - unshifted.item()) > 1e-4


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("implicit", [False, True], ids=["explicit", "implicit"])
def test_training_reduces_loss_on_a_fixed_batch(implicit):
    model = make_model(implicit, seed=9, fixed_point=dict(train_max_iter=4, train_tol=1e-12, phantom_steps=1)).train()
    ids = token_ids(4, 8, seed=10, vocab=VOCAB)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        out = model(ids, labels=ids)
        optimiser.zero_grad()
        out.loss.backward()
        optimiser.step()
        losses.append(out.loss.item())

    assert losses[-1] < 0.7 * losses[0]
    if implicit:
        # A tolerance no iterate meets: the solve spends its whole training budget.
        assert out.fixed_point.batch_passes == 4
        assert out.fixed_point.passes.tolist() == [4] * 4
    else:
        assert out.fixed_point is None


@pytest.mark.parametrize(
    "implicit, options",
    [
        (False, {}),
        (True, dict(unroll_steps=2)),
        (True, dict(train_max_iter=2, phantom_steps=1)),
    ],
    ids=["explicit", "implicit-unroll", "implicit-phantom"],
)
@pytest.mark.device
def test_gradient_reaches_every_parameter(implicit, options, device):
    model = make_model(implicit, seed=13, fixed_point=options).train().to(device)
    ids = token_ids(2, 5, seed=14, vocab=VOCAB).to(device)
    model(ids, labels=ids).loss.backward()
    missing = [name for name, param in model.named_parameters() if param.grad is None]
    assert missing == []
    for name, param in model.named_parameters():
        assert torch.isfinite(param.grad).all() and param.grad.abs().max() > 0, name


def test_weight_norm_only_on_implicit_backbones():
    implicit, explicit = make_model(implicit=True), make_model(implicit=False)
    mixer = implicit.stack.layers[0].mixer
    for module in (mixer.in_proj, mixer.conv1d, mixer.out_proj):
        assert hasattr(module, "parametrizations") and "weight" in module.parametrizations
    assert not hasattr(explicit.stack.layers[0].mixer.in_proj, "parametrizations")


# ---------------------------------------------------------------- invalid use


def test_invalid_mode_is_rejected():
    model = make_model().eval()
    with pytest.raises(ValueError, match="mode must be one of"):
        model(token_ids(1, 3, seed=11, vocab=VOCAB), mode="parallel")


def test_sequential_training_with_grad_is_rejected():
    model = make_model().train()
    with pytest.raises(ValueError, match="sequential"):
        model(token_ids(1, 3, seed=12, vocab=VOCAB), mode="sequential")


def test_unknown_fixed_point_key_in_config_is_rejected():
    with pytest.raises(OptionError, match="did you mean 'train_max_iter'"):
        make_config(fixed_point=dict(train_max_iters=8))
    with pytest.raises(OptionError, match="tau"):
        make_config(fixed_point=dict(tau=2.0))
    model = make_model()
    with pytest.raises(OptionError, match="did you mean 'train_tol'"):
        model.set_fixed_point_options(train_tols=1e-3)


def test_invalid_label_alignment_is_rejected():
    with pytest.raises(ValueError, match="label_alignment"):
        make_config(label_alignment="next")
