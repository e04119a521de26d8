"""Llama models: transformers parity, the two inference modes of the implicit model, training
and saving. RoPE and attention are tests/layers/test_attention.py."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from implicitlm.models import (
    ImplicitLlamaConfig,
    ImplicitLlamaForCausalLM,
    build_model,
    config_from_options,
    load_model,
)
from implicitlm.models.convert import from_hf_llama
from tests.layers.test_attention import THETA, assert_caches_close
from tests.support.models import assert_logits_close, assert_modes_agree, contractive_model, tiny_model, token_ids


# ---------------------------------------------------------------- transformers parity


def test_explicit_llama_matches_transformers():
    sizes = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=48, tie_word_embeddings=True)
    torch.manual_seed(0)
    # initializer_range 0.2: weights large enough for logits of order one and uneven attention.
    reference = LlamaForCausalLM(
        LlamaConfig(**sizes, rms_norm_eps=1e-5, initializer_range=0.2,
                    rope_parameters={"rope_type": "default", "rope_theta": THETA})
    ).eval()
    model = from_hf_llama(reference)
    ids = token_ids(2, 9, seed=6, vocab=64)

    with torch.no_grad():
        expected = reference(ids).logits
        logits = model(ids).logits

    assert expected.std() > 0.1
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the two modes


VOCAB = 10  # padded to 16
SIZES = dict(architecture="llama", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def make_model(implicit: bool = True, seed: int = 0, **overrides) -> ImplicitLlamaForCausalLM:
    return tiny_model(seed, **{**SIZES, "implicit": implicit, **overrides})


def converging_model(tol: float) -> ImplicitLlamaForCausalLM:
    """A float64 implicit model whose iteration converges fast."""
    return contractive_model(**SIZES, implicit=True, initializer_range=0.1, fixed_point=dict(tol=tol, max_iter=300))


@pytest.mark.device
def test_simultaneous_and_sequential_reach_the_same_fixed_point(device):
    model = converging_model(tol=1e-10).to(device)
    ids = token_ids(2, 7, seed=7, vocab=VOCAB).to(device)
    _, sequential = assert_modes_agree(model, ids, relative=1e-6, batch_passes=10)
    assert all(cache.length == 7 for cache in sequential.state)


@pytest.mark.device
def test_explicit_sequential_equals_simultaneous(device):
    model = make_model(implicit=False, initializer_range=0.3).double().eval().to(device)
    ids = token_ids(2, 9, seed=8, vocab=VOCAB).to(device)
    with torch.no_grad():
        parallel = model(ids)
        sequential = model(ids, mode="sequential")
        _, parallel_caches = model.stack(model.embeddings(ids), None)
    assert parallel.fixed_point is None and sequential.fixed_point is None
    assert_logits_close(sequential.logits, parallel.logits, relative=1e-9)
    for step_cache, parallel_cache in zip(sequential.state, parallel_caches):
        assert_caches_close(step_cache, parallel_cache)


# ---------------------------------------------------------------- training and saving


@pytest.mark.parametrize(
    "implicit, options",
    [(False, {}), (True, dict(train_max_iter=2, phantom_steps=1))],
    ids=["explicit", "implicit-phantom"],
)
@pytest.mark.device
def test_gradient_reaches_every_parameter(implicit, options, device):
    model = make_model(implicit, seed=9, fixed_point=options).train().to(device)
    ids = token_ids(2, 5, seed=10, vocab=VOCAB).to(device)
    model(ids, labels=ids).loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all() and param.grad.abs().max() > 0, name


def test_weight_norm_only_on_implicit_backbones():
    implicit, explicit = make_model(implicit=True), make_model(implicit=False)
    block = implicit.stack.layers[0]
    attention, mlp = block.self_attn, block.mlp
    for linear in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                   mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        assert "weight" in linear.parametrizations
    assert not hasattr(explicit.stack.layers[0].self_attn.q_proj, "parametrizations")


def test_save_and_load_round_trip(tmp_path):
    model = make_model(seed=11).eval()
    ids = token_ids(2, 6, seed=12, vocab=VOCAB)
    model.save_pretrained(tmp_path / "llama")
    reloaded = load_model(tmp_path / "llama")

    assert type(reloaded) is ImplicitLlamaForCausalLM and reloaded.config.num_key_value_heads == 2
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)


# ---------------------------------------------------------------- configuration


def test_config_defaults_are_the_authors():
    config = ImplicitLlamaConfig()
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (768, 12, 12)
    assert config.intermediate_size == 2048 and config.num_key_value_heads == 12 and config.rope_theta == 5e5
    assert ImplicitLlamaConfig(hidden_size=1024).intermediate_size == 2730


def test_options_pick_the_architecture():
    llama = build_model(config_from_options({"architecture": "llama", "vocab_size": VOCAB, "hidden_size": 16,
                                             "num_hidden_layers": 1, "num_attention_heads": 2}))
    assert type(llama) is ImplicitLlamaForCausalLM and llama.config.model_type == "implicit_llama"
    with pytest.raises(ValueError, match="did you mean 'num_attention_heads'"):
        config_from_options({"architecture": "llama", "num_attention_head": 2})
    with pytest.raises(ValueError, match="unknown model option 'num_attention_heads'"):
        config_from_options({"num_attention_heads": 2})  # a Mamba2 option set by default
    with pytest.raises(ValueError, match="architecture must be one of"):
        config_from_options({"architecture": "gpt"})
