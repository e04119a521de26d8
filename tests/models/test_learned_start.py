"""``LearnedStart``: the one home of a model's learned initial guess, kept out of its weights,
giving each mode's first iterate as the options say and the last fixed point a state carries."""

from __future__ import annotations

import functools

import torch

from implicitlm.deq import InitialGuess
from implicitlm.models.learned_start import LearnedStart
from implicitlm.models.stack import StackState

from tests.support.models import family_model, token_ids

VOCAB = 24


def guessing_model(**options):
    model = family_model("mamba2", True, VOCAB, torch.float32, **options)
    torch.manual_seed(0)
    model.attach_learned_guess(InitialGuess(16, readouts=model.stack.readout_sizes()).eval().requires_grad_(False),
                               use=None)
    return model


def test_the_guess_is_held_by_the_model_s_start_out_of_its_module_tree_and_weights():
    model = family_model("mamba2", True, VOCAB, torch.float32)
    weights = set(model.state_dict())
    guess = InitialGuess(16)
    model.attach_learned_guess(guess)
    assert isinstance(model.learned_start, LearnedStart)
    assert model.learned_guess is guess and model.learned_start.guess is guess
    assert set(model.state_dict()) == weights
    assert not {id(parameter) for parameter in guess.parameters()} & {id(parameter) for parameter in model.parameters()}
    model.attach_learned_guess(None)
    assert model.learned_guess is None and model.solver.options.initial_guess_for("simultaneous") == "zero"


def test_each_mode_starts_from_the_guess_only_where_its_options_ask_for_it():
    model = guessing_model(fixed_point=dict(simultaneous_initial_guess="learned", sequential_initial_guess="zero"))
    start, guess = model.learned_start, model.learned_guess
    with torch.no_grad():
        embedded = model.embeddings(token_ids(2, 5, seed=1, vocab=VOCAB))
        assert torch.equal(start.first_iterate(model.solver.options, model.stack, embedded), guess(embedded))
        assert start.token_guess(model.solver.options, model.stack, embedded, None) is None
        model.set_fixed_point_options(simultaneous_initial_guess="zero", sequential_initial_guess="learned")
        assert torch.equal(start.first_iterate(model.solver.options, model.stack, embedded), torch.zeros_like(embedded))
        previous = torch.randn(2, 16)
        state = model.stack.initial_state(2, embedded.device, embedded.dtype)
        read = functools.partial(model.stack.read_state, state)
        assert torch.equal(start.token_guess(model.solver.options, model.stack, embedded, previous)(3, None, state),
                           guess(embedded[:, 3], previous, read))


def test_a_returned_state_carries_the_last_fixed_point_only_where_a_guess_starts_a_solve():
    model = guessing_model(fixed_point=dict(initial_guess="zero"))
    tokens = token_ids(2, 5, seed=1, vocab=VOCAB)
    z = torch.randn(2, 5, 16)
    with torch.no_grad():
        state = model(tokens, use_cache=True).state
        assert not isinstance(state, StackState)
        assert model.learned_start.with_last_fixed_point(model.solver.options, state, z) is state
        model.set_fixed_point_options(sequential_initial_guess="learned")
        carried = model.learned_start.with_last_fixed_point(model.solver.options, state, z)
        assert list(carried) == list(state) and torch.equal(carried.last_fixed_point, z[:, -1])
        assert isinstance(model(tokens, use_cache=True).state, StackState)
