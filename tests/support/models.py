"""Tiny models of every family, the token ids they read, and the check that their two solving
modes agree, as the tests build and run them. A test passes the sizes, seed and solver options
it asserts on: a changed seed or size changes the numbers a test compares."""

from __future__ import annotations

import torch

from implicitlm.models import build_model, config_from_options

from tests.support.contractive import make_contractive

# Two blocks of width 16 per family: the learned-solver and warm-start tests of every family take these.
SMALL = {
    "mamba2": dict(architecture="mamba2", hidden_size=16, num_hidden_layers=2, state_size=8, head_dim=8, chunk_size=8),
    "llama": dict(architecture="llama", hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, intermediate_size=24),
    "mamba": dict(architecture="mamba", hidden_size=16, num_hidden_layers=2, state_size=4, chunk_size=8),
}
# What generation, scoring and the decoding graphs add per family to a 2-block model of width 16.
FAMILY_SIZES = {
    "mamba2": dict(state_size=8, head_dim=8, chunk_size=4),
    "llama": dict(num_attention_heads=2),
    "mamba": dict(state_size=4, chunk_size=4),
}


def tiny_model(seed: int = 0, **options):
    """The model ``options`` (``--model`` options; ``architecture`` picks the family, mamba2
    by default) describe, its weights drawn after seeding torch with ``seed``."""
    torch.manual_seed(seed)
    return build_model(config_from_options(options))


def contractive_model(seed: int = 0, dtype: torch.dtype = torch.float64, **options):
    """``tiny_model`` cast to ``dtype``, in eval mode, its map made contractive so that its
    fixed-point iteration converges fast."""
    return make_contractive(tiny_model(seed, **options).to(dtype).eval())


def family_model(architecture: str, implicit: bool, vocab: int, dtype: torch.dtype = torch.float64, **options):
    """A 2-block model of width 16 of ``architecture`` (FAMILY_SIZES) in ``dtype``, in eval
    mode, initialised with a 0.1 range and, implicit, made contractive."""
    options = dict(architecture=architecture, vocab_size=vocab, hidden_size=16, num_hidden_layers=2,
                   implicit=implicit, initializer_range=0.1, **FAMILY_SIZES[architecture], **options)
    return contractive_model(dtype=dtype, **options) if implicit else tiny_model(**options).to(dtype).eval()


def with_stack(model, stack):
    """``model`` running ``stack`` in place of its own: the module its weights are named by and
    the one its passes (``model.stack_passes``) run, in the model's mode (training or not), which
    the passes read off the stack."""
    model.stack = model.stack_passes.stack = stack.train(model.training)
    return model


def token_ids(batch: int, length: int, seed: int, vocab: int) -> torch.Tensor:
    """``batch`` rows of ``length`` token ids below ``vocab``, drawn from their own generator."""
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_logits_close(actual: torch.Tensor, expected: torch.Tensor, relative: float) -> None:
    """Close up to ``relative`` times the largest logit (the logits are small, ~0.1, at init),
    with the same argmax."""
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=0, atol=relative * scale)
    assert torch.equal(actual.argmax(-1), expected.argmax(-1))


def assert_modes_agree(model, ids: torch.Tensor, relative: float, batch_passes: int):
    """Solved simultaneously and token by token, ``model`` converges on ``ids`` both ways,
    after more than ``batch_passes`` passes (a genuine iteration, not a one-step map), to
    logits within ``relative``; returns the two outputs (simultaneous, sequential)."""
    with torch.no_grad():
        simultaneous = model(ids, mode="simultaneous")
        sequential = model(ids, mode="sequential")
    assert simultaneous.fixed_point.converged.all() and sequential.fixed_point.converged.all()
    assert sequential.fixed_point.passes.shape == ids.shape
    assert simultaneous.fixed_point.batch_passes > batch_passes
    assert_logits_close(sequential.logits, simultaneous.logits, relative)
    return simultaneous, sequential
