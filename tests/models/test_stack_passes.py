"""``StackPasses``: the object a model holds for its stack's passes, run by itself: K passes are
K applications of the stack's map, a probe stops each solve of its call at one evaluation, and the
object adds no weights and no reference back to the model."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from torch import nn

from implicitlm.deq import Budget
from implicitlm.deq.options import every_solve_by
from implicitlm.models.learned_solver import InitialGuess
from implicitlm.models.stack_passes import StackPasses

from tests.support.learned_solver import active_mixing
from tests.support.models import SMALL, contractive_model, tiny_model, token_ids

VOCAB = 24


def small_model(architecture: str = "mamba2", dtype: torch.dtype = torch.float64):
    return contractive_model(dtype=dtype, **SMALL[architecture], vocab_size=VOCAB, implicit=True)


def tokens(batch: int = 2, length: int = 6):
    return token_ids(batch, length, seed=4, vocab=VOCAB)


def solve_inputs(model, ids):
    embedded = model.embeddings(ids)
    return embedded, model.injection(model.injection_norm(embedded))


@pytest.mark.parametrize("start", ["zero", "learned"])
@pytest.mark.parametrize("architecture", ["mamba2", "llama"])
def test_k_simultaneous_passes_are_k_applications_of_the_stack_map_from_the_first_iterate(architecture, start):
    model = small_model(architecture, dtype=torch.float32)
    if start == "learned":
        torch.manual_seed(1)
        model.attach_learned_guess(InitialGuess(16).eval().requires_grad_(False))
    passes = model.stack_passes
    with torch.no_grad():
        embedded, injection = solve_inputs(model, tokens())
        z, stats, _ = passes.simultaneous(embedded, injection, None, None, False, passes.call_budget("simultaneous", passes=3),
                                          chunk_length=0)
        first = model.learned_solver.first_iterate(model.solver.options, model.stack, embedded)
        stack_map = passes.stack_map(injection, None, None)
        by_hand = first
        for _ in range(3):
            by_hand = stack_map(by_hand)[0]
    assert torch.equal(z, by_hand)
    assert stats.batch_passes == 3
    assert bool(first.any()) == (start == "learned")


def test_the_model_s_forward_is_its_passes_then_its_head():
    model = small_model("llama")
    ids = tokens()
    with torch.no_grad():
        output = model(ids, use_cache=True)
        embedded, injection = solve_inputs(model, ids)
        budget = model.stack_passes.call_budget("simultaneous")
        z, stats, state = model.stack_passes.simultaneous(embedded, injection, None, None, True, budget, 0)
        sequential = model(ids, mode="sequential")
        z_sequential, _, _ = model.stack_passes.sequential(embedded, injection, None,
                                                           model.stack_passes.call_budget("sequential"))
    assert torch.equal(output.logits, model._logits(z))
    assert torch.equal(sequential.logits, model._logits(z_sequential))
    assert torch.equal(output.fixed_point.passes, stats.passes)
    assert all(torch.equal(a, b) for old, new in zip(output.state, state)
               for a, b in zip(vars(old).values(), vars(new).values()) if isinstance(a, torch.Tensor))


def test_a_probe_stops_each_solve_at_one_evaluation_whatever_its_budget_and_an_unroll_keeps_its_passes():
    model = small_model()
    passes = model.stack_passes
    ids = tokens()
    with torch.no_grad():
        embedded, injection = solve_inputs(model, ids)
        solved = passes.simultaneous(embedded, injection, None, None, False, passes.call_budget("simultaneous"), 0)[1]
        assert solved.batch_passes > 1
        budget = passes.call_budget("simultaneous", passes=4, probe=True)
        assert budget == Budget.to_tolerance(float("inf"), 1)
        assert passes.call_budget("sequential", probe=True) == budget
        probed = passes.simultaneous(embedded, injection, None, None, False, budget, 0)[1]
        assert probed.batch_passes == 1 and bool(probed.converged.all())
        assert model(ids, mode="sequential", probe=True).fixed_point.passes.max() == 1
        # A probe is its call's alone: the next call solves with the budget it asks for.
        assert passes.call_budget("simultaneous", passes=4) == Budget.exactly(4, model.solver.options.tol)
        assert model(ids).fixed_point.batch_passes == solved.batch_passes
    model.train()
    assert passes.call_budget("simultaneous", passes=3, probe=True).kind == "unrolled"


@pytest.mark.parametrize("architecture", list(SMALL))
def test_the_passes_are_no_module_and_add_no_weights(architecture):
    model = tiny_model(**SMALL[architecture], vocab_size=VOCAB, implicit=True)
    assert isinstance(model.stack_passes, StackPasses) and not isinstance(model.stack_passes, nn.Module)
    assert model.stack_passes.stack is model.stack
    assert all(module is not model.stack_passes for module in model.modules())
    names = set(model.state_dict())
    assert not [name for name in names if "passes" in name]
    assert names == {f"stack.{name}" for name in model.stack.state_dict()} | {
        name for name in names if name.split(".")[0] in ("embeddings", "injection_norm", "injection", "lm_head")}


def test_the_solver_the_model_replaces_is_the_one_its_passes_solve_with():
    model = small_model()
    assert model.solver is model.stack_passes.solver
    model.set_fixed_point_options(max_iter=7)
    assert model.stack_passes.solver.options.max_iter == 7 and model.solver is model.stack_passes.solver
    model.attach_learned_mixing(active_mixing())
    model.set_fixed_point_options(**every_solve_by("learned_anderson"))
    assert model.solver is model.stack_passes.solver and model.solver.options.solver == "learned_anderson"
    with torch.no_grad():
        assert model(tokens()).fixed_point.solver == "learned_anderson"


def test_the_passes_follow_the_model_s_mode_and_its_copies():
    model = small_model()
    assert not model.stack_passes.training
    model.train()
    assert model.stack_passes.training and model.stack_passes.chunk_length(4) == 0
    model.eval()
    assert model.stack_passes.chunk_length(4) == 4
    copied = copy.deepcopy(model)
    assert copied.stack_passes.stack is copied.stack and copied.stack_passes.stack is not model.stack


def test_a_dropped_model_is_freed_at_once_the_passes_hold_no_reference_back_to_it():
    model = small_model()
    with torch.no_grad():
        model(tokens(), use_cache=True)
    dropped = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert dropped() is None
    finally:
        gc.enable()
