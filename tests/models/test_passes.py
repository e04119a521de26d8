"""A model's inference budget in passes: declared by its checkpoint, overridden per call,
carried through generation token by token in any dtype."""

from __future__ import annotations

import copy

import json

import pytest
import torch

import implicitlm.models  # noqa: F401  (registers the Auto classes)
from implicitlm.core.errors import OptionError
from implicitlm.core.file_digests import write_model_digests
from implicitlm.models import load_model

from tests.support.learned_solver import TOKENS, contractive
from tests.support.models import family_model


def counted_steps(model) -> list[int]:
    """A list that grows by one at every token step of ``model``'s stack."""
    calls: list[int] = []
    original = model.stack.step
    model.stack.step = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("architecture", ["mamba2", "llama"])
def test_k_pass_decoding_equals_the_sequential_forward_at_the_same_k(architecture, dtype, caplog):
    model = contractive(architecture).to(dtype)
    prompt = TOKENS[:, :5]
    steps = counted_steps(model)
    generated = model.generate(prompt, max_new_tokens=6, do_sample=False, mode="sequential", passes=2)
    # Two steps per token, the prompt's and each new one's but the last (whose token is never read).
    assert len(steps) == 2 * (5 + 5)
    with torch.no_grad():
        whole = model(generated, mode="sequential", passes=2, use_cache=True)
        head = model(generated[:, :7], mode="sequential", passes=2, use_cache=True)
        tail = model(generated[:, 7:], mode="sequential", passes=2, state=head.state)
    assert torch.equal(whole.logits[:, 4:-1].argmax(-1), generated[:, 5:])
    assert torch.equal(torch.cat([head.logits, tail.logits], dim=1), whole.logits)
    for carried, own in zip(tail.state, whole.state):
        assert all(torch.equal(getattr(carried, name), getattr(own, name)) for name in vars(own)
                   if isinstance(getattr(own, name), torch.Tensor))
    convergence = model.generation_convergence
    assert convergence["fp_fixed_points"] == convergence["fp_in_passes"] == 3 * (5 + 5)  # the prompt's and the new
    assert not [record for record in caplog.records if "stopped above the tolerance" in record.getMessage()]


def test_a_checkpoint_declares_its_passes_and_a_call_overrides_them(tmp_path):
    model = contractive("mamba2")
    model.set_fixed_point_options(passes=2)
    model.save_pretrained(tmp_path / "two")
    loaded = load_model(tmp_path / "two")
    assert loaded.solver.options.passes == 2
    with torch.no_grad():
        declared = loaded(TOKENS).fixed_point
        tight = loaded(TOKENS, passes=0).fixed_point
        sequential = loaded(TOKENS, mode="sequential").fixed_point
    assert declared.batch_passes == 2 and declared.solver == "2_passes"
    assert tight.batch_passes > 2 and bool(tight.converged.all()) and tight.solver == "safeguarded_anderson"
    assert bool((sequential.passes == 2).all())
    steps = counted_steps(loaded)
    loaded.generate(TOKENS[:, :4], max_new_tokens=3, do_sample=False)
    assert len(steps) == 2 * 2  # the two decoded tokens read by a step, two passes each


def test_a_config_saved_before_passes_existed_loads_solving_to_the_tolerance(tmp_path):
    contractive("mamba2").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["fixed_point"]["passes"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_model_digests(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.solver.options.passes == 0
    with torch.no_grad():
        assert bool(loaded(TOKENS).fixed_point.converged.all())


@pytest.mark.parametrize("passes", [-1, 1.5, "2", True, 10_001])
def test_a_calls_passes_outside_the_rule_is_refused_naming_it(passes):
    model = contractive("mamba2")
    with pytest.raises(OptionError, match="argument 'passes' must be"):
        model(TOKENS, passes=passes)
    with pytest.raises(OptionError, match="fixed-point option 'passes' must be"):
        model.set_fixed_point_options(passes=passes)


def test_a_training_forward_of_k_passes_is_the_unroll_of_k_passes_without_the_penalty():
    """A training forward given K passes differentiates through K passes from z = 0 (the
    few-pass stage's forward), the phase's Jacobian penalty left out: the loss and gradients of
    a model whose options unroll K passes, and the options of the model given it unchanged
    (before, the stage set them on the live model and put them back)."""
    model = contractive("mamba2").train()
    model.set_fixed_point_options(jacobian_penalty=0.5)
    phase = model.solver.options
    unrolling = copy.deepcopy(model)
    unrolling.set_fixed_point_options(unroll_steps=3, jacobian_penalty=0.0)
    given, unrolled = model(TOKENS, labels=TOKENS, passes=3), unrolling(TOKENS, labels=TOKENS)
    given.loss.backward()
    unrolled.loss.backward()
    assert given.fixed_point.solver == "unroll" and given.fixed_point.jacobian_penalty is None
    assert torch.equal(given.loss, unrolled.loss)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), unrolling.parameters()))
    assert model.solver.options == phase
    assert not torch.equal(model(TOKENS, labels=TOKENS, passes=1).loss, given.loss)
    # Solving to the tolerance is what training does: passes 0 asks for nothing else.
    model.set_fixed_point_options(jacobian_penalty=0.0)
    assert torch.equal(model(TOKENS, labels=TOKENS, passes=0).loss, model(TOKENS, labels=TOKENS).loss)


def test_an_explicit_model_refuses_passes_it_has_none_of():
    """An explicit model makes one pass: K passes asked of it, per call or as its option, are
    refused in one line (before, ignored)."""
    model = family_model("mamba2", False, 64)
    with pytest.raises(OptionError, match="passes=2: an explicit model makes one pass of its stack"):
        model(TOKENS, passes=2)
    with pytest.raises(OptionError, match="passes=3: an explicit model makes one pass of its stack"):
        model.set_fixed_point_options(passes=3)
    assert model.solver.options.passes == 0 and model(TOKENS, passes=0).logits.shape == (3, 12, 64)
