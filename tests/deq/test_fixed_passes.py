"""Solves of exactly K passes (``passes``): the answer is K applications of the model's map
from the start the options say, in both modes; the stats say how far from a fixed point it is
and nothing is checked, retried or raised."""

from __future__ import annotations

import pytest
import torch

from implicitlm.core.errors import NumericalFault, OptionError
from implicitlm.deq import row_tracker
from implicitlm.models.learned_solver import InitialGuess

from tests.support.learned_solver import TOKENS, contractive


def guessing(model):
    """``model`` starting every inference solve from a random learned guess (far from the fixed
    point, so that where a solve starts shows in its answer)."""
    torch.manual_seed(3)
    model.attach_learned_guess(InitialGuess(model.config.hidden_size).eval().requires_grad_(False))
    return model


def simultaneous_by_hand(model, passes: int) -> torch.Tensor:
    """z_K of K passes of the stack over the whole sequence, from the model's first iterate."""
    with torch.no_grad():
        embedded = model.embeddings(TOKENS)
        stack_map = model.stack_passes.stack_map(model._injected(embedded), None, None)
        z = model.learned_solver.first_iterate(model.solver.options, model.stack, embedded)
        for _ in range(passes):
            z = stack_map(z)[0]
    return z


def sequential_by_hand(model, passes: int, guess: InitialGuess | None) -> torch.Tensor:
    """Token by token: K steps from z = 0 or the guess (which reads the previous token's answer),
    each token from the state of the previous token's last step."""
    with torch.no_grad():
        embedded = model.embeddings(TOKENS)
        injection = model._injected(embedded)
        state = model.stack.initial_state(TOKENS.shape[0], dtype=embedded.dtype)
        answers = []
        for t in range(TOKENS.shape[1]):
            previous = answers[-1] if answers else None
            z = torch.zeros_like(embedded[:, t]) if guess is None else guess(embedded[:, t], previous)
            for _ in range(passes):
                z, next_state = model.stack.step(z, injection[:, t], state)
            state = next_state
            answers.append(z)
    return torch.stack(answers, dim=1)


def answers(model, mode: str, passes: int):
    with torch.no_grad():
        output = model(TOKENS, mode=mode, passes=passes, output_hidden_states=True)
    return output.hidden_states[-1], output.fixed_point


@pytest.mark.parametrize("start", ["zero", "learned"])
@pytest.mark.parametrize("passes", [1, 2, 3])
def test_k_passes_in_simultaneous_mode_are_k_applications_of_the_map(start, passes):
    model = contractive("mamba2")
    if start == "learned":
        guessing(model)
    z, stats = answers(model, "simultaneous", passes)
    assert torch.equal(z, simultaneous_by_hand(model, passes))
    assert stats.batch_passes == passes and stats.passes.tolist() == [passes] * TOKENS.shape[0]
    assert stats.solver == f"{passes}_passes" + ("+learned_guess" if start == "learned" else "")


@pytest.mark.parametrize("start", ["zero", "learned"])
@pytest.mark.parametrize("architecture", ["mamba2", "llama"])
def test_k_passes_in_sequential_mode_are_k_steps_per_token(start, architecture):
    model = contractive(architecture)
    guess = guessing(model).learned_guess if start == "learned" else None
    for passes in (1, 2, 3):
        z, stats = answers(model, "sequential", passes)
        torch.testing.assert_close(z, sequential_by_hand(model, passes, guess), atol=1e-6, rtol=0)
        assert stats.passes.shape == TOKENS.shape and bool((stats.passes == passes).all())
        assert stats.batch_passes == passes * TOKENS.shape[1]


def test_the_first_pass_from_zero_is_f_of_zero_and_the_guess_changes_the_answer():
    model = contractive("mamba2")
    one_from_zero = answers(model, "simultaneous", 1)[0]
    assert torch.equal(one_from_zero, simultaneous_by_hand(model, 1))
    assert not torch.allclose(answers(guessing(model), "simultaneous", 1)[0], one_from_zero, atol=1e-3)


def test_the_residual_is_the_last_steps_and_falls_with_the_passes():
    model = contractive("mamba2")
    with torch.no_grad():
        last, before = simultaneous_by_hand(model, 3), simultaneous_by_hand(model, 2)
    stats = answers(model, "simultaneous", 3)[1]
    expected = (last - before).flatten(1).norm(dim=1) / last.flatten(1).norm(dim=1)
    torch.testing.assert_close(stats.rel_residual, expected, atol=1e-6, rtol=1e-5)
    residuals = [answers(model, "simultaneous", k)[1].rel_residual.max().item() for k in (1, 2, 4, 8)]
    assert residuals == sorted(residuals, reverse=True)


def test_k_passes_neither_raise_nor_retry_where_the_tolerance_is_missed():
    # A tolerance no 2-pass answer meets, errors asked for on nonconvergence, chunks that a
    # solve to the tolerance would retry: K passes per chunk, no more, and no error.
    model = contractive("mamba2")
    model.set_fixed_point_options(tol=1e-6, nonconvergence="error", chunk_length=4)
    calls = []
    original = model.stack.forward
    model.stack.forward = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    with torch.no_grad(), model.track_convergence() as tally:
        output = model(TOKENS, passes=2)
    assert len(calls) == 3 * 2 and output.fixed_point.batch_passes == 3 * 2
    assert not bool(output.fixed_point.converged.any())
    # Reports give the budget for what it is, K passes and their last pass's residual, never a
    # share "not converged" (before: 100%): there was no tolerance to reach, and no warning.
    residual = output.fixed_point.residual.double()
    assert tally.not_converged == tally.budget == 0 and tally.in_passes == TOKENS.shape[0]
    assert tally.as_dict() == {"fp_fixed_points": 3, "fp_non_finite": 0, "fp_in_passes": 3, "fp_passes_per_solve": 2,
                               "fp_last_residual_mean": pytest.approx(float(residual.mean())),
                               "fp_last_residual_max": pytest.approx(float(residual.max()))}
    assert float(residual.min()) > 1e-6 and tally.warning("scoring") is None
    # The same budget as a solve to the tolerance: refused, as asked.
    with pytest.raises(NumericalFault, match="fixed point not reached"):
        model(TOKENS, passes=0, max_iter=2)


@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_k_passes_run_no_tracker_and_compute_the_guess_once_per_solve(mode, monkeypatch):
    """The cost of K passes is K passes: no per-pass tracking of rows and residuals (the
    tolerance solve's ``RowTracker``), one guess per token (sequential) or sequence."""
    model = guessing(contractive("mamba2"))
    guesses, passes = [], []
    original_guess, original_step = model.learned_guess.forward, model.stack.step
    model.learned_guess.forward = lambda *args, **kwargs: guesses.append(1) or original_guess(*args, **kwargs)
    model.stack.step = lambda *args, **kwargs: passes.append(1) or original_step(*args, **kwargs)

    def tracked(*args, **kwargs):
        raise AssertionError("a K-pass solve tracked its rows")

    monkeypatch.setattr(row_tracker, "RowTracker", tracked)
    answers(model, mode, 3)
    tokens = TOKENS.shape[1]
    assert len(guesses) == (tokens if mode == "sequential" else 1)
    assert len(passes) == (3 * tokens if mode == "sequential" else 0)


def test_options_refuse_errors_on_nonconvergence_beside_a_budget_of_passes():
    """Before, held together and the error never raised (a record said "error" of a run that
    could not stop for it); now refused in one line, and held where the budget is a tolerance."""
    model = contractive("mamba2")
    model.set_fixed_point_options(passes=2)
    with pytest.raises(OptionError, match=r"^nonconvergence='error' stops a run whose solves miss tol; passes=2 holds no "
                                          r"tolerance to miss: set passes=0 to solve to tol, or nonconvergence='report'$"):
        model.set_fixed_point_options(nonconvergence="error")
    assert model.solver.options.nonconvergence == "report" and model.solver.options.passes == 2
    model.set_fixed_point_options(passes=0, nonconvergence="error")
    assert model.solver.options.nonconvergence == "error"
