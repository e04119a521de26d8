"""``LearnedSolver``: the one home of a model's learned initial guess and learned mixing, kept out
of its weights and on its device, giving each mode's first iterate as the options say and the
last fixed point a state carries, and loading both from beside the weights; and
``without_learned_solver``, how a model solves without them."""

from __future__ import annotations

import functools

import pytest
import torch

from implicitlm.deq import FixedPointOptions, solvers
from implicitlm.deq.options import every_solve_by
from implicitlm.models.errors import ModelLoadError
from implicitlm.models.learned_solver import MIXING_FILE, InitialGuess, LearnedSolver, without_learned_solver
from implicitlm.models.stack import StackState

from tests.support.learned_solver import active_mixing
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
    assert isinstance(model.learned_solver, LearnedSolver)
    assert model.learned_guess is guess and model.learned_solver.guess is guess
    assert set(model.state_dict()) == weights
    assert not {id(parameter) for parameter in guess.parameters()} & {id(parameter) for parameter in model.parameters()}
    model.attach_learned_guess(None)
    assert model.learned_guess is None and model.solver.options.initial_guess_for("simultaneous") == "zero"


def test_each_mode_starts_from_the_guess_only_where_its_options_ask_for_it():
    model = guessing_model(fixed_point=dict(simultaneous_initial_guess="learned", sequential_initial_guess="zero"))
    start, guess = model.learned_solver, model.learned_guess
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
        assert model.learned_solver.with_last_fixed_point(model.solver.options, state, z) is state
        model.set_fixed_point_options(sequential_initial_guess="learned")
        carried = model.learned_solver.with_last_fixed_point(model.solver.options, state, z)
        assert list(carried) == list(state) and torch.equal(carried.last_fixed_point, z[:, -1])
        assert isinstance(model(tokens, use_cache=True).state, StackState)


def test_the_mixing_is_held_by_the_model_s_start_out_of_its_module_tree_and_solves_with_it():
    """Beside the guess, in the same home (before: a ``model.__dict__`` entry of its own)."""
    model = guessing_model()
    weights = set(model.state_dict())
    tokens = token_ids(2, 5, seed=1, vocab=VOCAB)
    with torch.no_grad():
        model.set_fixed_point_options(**every_solve_by("safeguarded_anderson"))
        plain = model(tokens).fixed_point.passes
        mixing = active_mixing()
        model.attach_learned_mixing(mixing)
        model.set_fixed_point_options(**every_solve_by("learned_anderson"))
        mixed = model(tokens).fixed_point.passes
    assert model.learned_mixing is mixing and model.learned_solver.mixing is mixing
    assert "learned_mixing" not in vars(model) and set(model.state_dict()) == weights
    assert not torch.equal(mixed, plain)  # the mixing moves every step: the solver uses it
    model.attach_learned_mixing(None)
    assert model.learned_mixing is None and model.learned_guess is not None


def test_the_guess_and_mixing_move_with_the_model_and_to_it_when_attached():
    """Every move of the model takes them along; one attached elsewhere joins it (before: the
    mixing stayed where it was made, the guess moved at its first use)."""
    model = guessing_model()
    mixing = active_mixing()
    model.attach_learned_mixing(mixing)
    model.to("meta")
    assert {parameter.device.type for network in (model.learned_guess, mixing)
            for parameter in network.parameters()} == {"meta"}
    model.attach_learned_guess(InitialGuess(16), use=None)
    assert model.learned_guess.out.weight.device.type == "meta"


def test_the_start_loads_what_lies_beside_the_weights_and_refuses_what_the_options_need_and_lack(tmp_path):
    """What the loader calls: both networks as saved, attached without changing the options; a
    file the options name but the folder lacks is a one-line ModelLoadError; an explicit model
    reads none."""
    model = guessing_model(fixed_point=dict(simultaneous_solver="learned_anderson"))
    model.attach_learned_mixing(active_mixing())
    model.save_pretrained(tmp_path / "m")
    fresh = family_model("mamba2", True, VOCAB, torch.float32, fixed_point=dict(simultaneous_solver="learned_anderson"))
    options = fresh.solver.options
    fresh.learned_solver.load(fresh, tmp_path / "m")
    assert fresh.solver.options == options
    for network, loaded in ((model.learned_guess, fresh.learned_guess), (model.learned_mixing, fresh.learned_mixing)):
        assert network.state_dict().keys() == loaded.state_dict().keys()
        assert all(torch.equal(tensor, loaded.state_dict()[name]) for name, tensor in network.state_dict().items())
    (tmp_path / "m" / MIXING_FILE).unlink()
    with pytest.raises(ModelLoadError, match="missing, but the config's fixed_point names solver 'learned_anderson'") \
            as refused:
        fresh.learned_solver.load(fresh, tmp_path / "m")
    assert "\n" not in str(refused.value)
    explicit = family_model("mamba2", False, VOCAB, torch.float32)
    explicit.learned_solver.load(explicit, tmp_path / "m")
    assert explicit.learned_guess is None and explicit.learned_mixing is None


def test_without_a_learned_solver_and_what_a_load_requires_follow_the_solver_table(tmp_path, monkeypatch):
    """A run or fit without the learned solver solves from z = 0 by what the table says stands
    in for each solver that mixes by a learned mixing, and a load requires the mixing file where
    the table says a solver the config names needs it: no branch on "learned_anderson" (before:
    one in each of the warm start, ``solver train`` and the loader). A table that said otherwise
    would be followed as surely."""
    options = FixedPointOptions(solver="learned_anderson", sequential_solver="anderson", initial_guess="learned",
                                simultaneous_initial_guess="learned")
    unguessed = {"initial_guess": "zero", "simultaneous_initial_guess": "", "sequential_initial_guess": ""}
    assert without_learned_solver(options) == {**unguessed, "solver": "safeguarded_anderson", "sequential_solver": "anderson"}
    saved = family_model("mamba2", True, VOCAB, torch.float32)
    saved.save_pretrained(tmp_path / "m")  # no mixing file

    def load(solver: str):
        fresh = family_model("mamba2", True, VOCAB, torch.float32, fixed_point=dict(sequential_solver=solver))
        fresh.learned_solver.load(fresh, tmp_path / "m")
        return fresh

    with pytest.raises(ModelLoadError, match="learned_mixing.safetensors: missing, but the config's fixed_point names "
                                             "solver 'learned_anderson'"):
        load("learned_anderson")
    assert load("anderson").learned_mixing is None
    monkeypatch.setattr(solvers, "_without_mixing", {"anderson": "fixed_point_iter"})
    assert without_learned_solver(options) == {**unguessed, "solver": "learned_anderson", "sequential_solver": "fixed_point_iter"}
    assert load("learned_anderson").learned_mixing is None
    with pytest.raises(ModelLoadError, match="missing, but the config's fixed_point names solver 'anderson'"):
        load("anderson")
