"""The learned initial guess: where a solve starts changes, the fixed point does not (its
file: test_saved_network.py)."""

from __future__ import annotations

import pytest
import torch

from implicitlm.core.errors import OptionError
from implicitlm.models.learned_solver import InitialGuess

from tests.support.learned_solver import TOKENS, contractive, run
from tests.support.models import SMALL


def fitted_guess(model, reads_state: bool = False) -> InitialGuess:
    """A guess fitted for a few steps to the model's own fixed points (a random one guesses
    far off, which must cost passes but never change the answer); ``reads_state``: one that
    reads the blocks' states too, fitted with the previous fixed points and states known."""
    torch.manual_seed(0)
    guess = InitialGuess(model.config.hidden_size, readouts=model.stack.readout_sizes() if reads_state else ())
    optimizer = torch.optim.Adam(guess.parameters(), lr=1e-2)
    embedded, z_star, _ = model.solve_fixed_point(TOKENS)
    previous = torch.cat([torch.zeros_like(z_star[:, :1]), z_star[:, :-1]], dim=1)
    reader = model.state_reader(embedded, z_star) if reads_state else None
    for _ in range(200):
        loss = (guess(embedded) - z_star).norm(dim=-1).mean()
        if reads_state:
            loss = loss + (guess(embedded, previous, reader) - z_star).norm(dim=-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return guess.eval().requires_grad_(False)


@pytest.mark.parametrize("architecture", sorted(SMALL))
@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_the_solve_from_a_learned_guess_reaches_the_fixed_point_of_the_solve_from_zero(architecture, mode):
    model = contractive(architecture)
    from_zero, zero_stats = run(model, mode)
    readouts = model.stack.readout_sizes()
    for guess in (fitted_guess(model), InitialGuess(model.config.hidden_size),  # fitted, and random
                  fitted_guess(model, reads_state=True), InitialGuess(model.config.hidden_size, readouts=readouts)):
        model.attach_learned_guess(guess)
        from_guess, stats = run(model, mode)
        assert bool(stats.converged.all()) and bool(zero_stats.converged.all())
        assert stats.solver == "safeguarded_anderson+learned_guess" and zero_stats.solver == "safeguarded_anderson"
        # Both within the tolerance of the one fixed point: the logits agree to its order.
        torch.testing.assert_close(from_guess, from_zero, atol=1e-3, rtol=1e-3)


def test_a_close_guess_saves_passes():
    # Not a law: on these random contractive Llama and Mamba stacks, a guess 12-24% from the
    # fixed point costs passes against z = 0, whose first image already lands near it.
    model = contractive("mamba2")
    zero_stats = run(model, "simultaneous")[1]
    model.attach_learned_guess(fitted_guess(model))
    assert run(model, "simultaneous")[1].passes.float().mean() < 0.9 * zero_stats.passes.float().mean()


def test_a_guess_follows_the_models_dtype():
    model = contractive("mamba2")
    model.attach_learned_guess(fitted_guess(model))
    model.to(torch.bfloat16)
    for mode in ("simultaneous", "sequential"):
        logits, stats = run(model, mode)
        assert logits.dtype == torch.bfloat16 and bool(torch.isfinite(logits).all()), mode


def test_learned_without_a_guess_is_refused_and_a_model_without_one_starts_from_zero():
    model = contractive("mamba2")
    assert model.learned_guess is None and model.solver.options.initial_guess == "zero"
    model.set_fixed_point_options(initial_guess="learned")
    with pytest.raises(OptionError, match="no learned initial guess"):
        run(model, "simultaneous")


def test_decoding_carries_the_last_fixed_point_to_the_next_tokens_guess():
    model = contractive("mamba2")
    plain = model.generate(TOKENS[:, :6], max_new_tokens=6, do_sample=False)
    guess = fitted_guess(model)
    model.attach_learned_guess(guess)
    read = []
    original = guess.forward
    guess.forward = lambda embedded, previous=None, read_state=None: (read.append(previous is not None)
                                                                       or original(embedded, previous, read_state))
    assert torch.equal(model.generate(TOKENS[:, :6], max_new_tokens=6, do_sample=False), plain)
    # The prefill (simultaneous) knows no previous fixed point; every decoded token's guess reads one.
    assert read[0] is False and all(read[1:]) and len(read) == 6
    with torch.no_grad():
        output = model(TOKENS[:, :6], use_cache=True)
        step = model(TOKENS[:, 6:7], state=output.state, mode="sequential")
        whole = model(TOKENS[:, :7], mode="sequential")
    assert torch.equal(output.state.last_fixed_point, model.solve_fixed_point(TOKENS[:, :6])[1][:, -1])
    torch.testing.assert_close(step.logits[:, -1], whole.logits[:, -1], atol=1e-3, rtol=1e-3)


def test_each_chunks_guess_reads_the_fixed_point_the_previous_chunk_left():
    model = contractive("mamba2")
    from_zero = run(model, "simultaneous")[0]
    guess = fitted_guess(model)
    model.attach_learned_guess(guess)
    read = []
    original = guess.forward
    guess.forward = lambda embedded, previous=None, read_state=None: (read.append(previous)
                                                                       or original(embedded, previous, read_state))
    with torch.no_grad():
        chunked = model(TOKENS, chunk_length=4)
    # Three chunks of 4: the first knows nothing before it; each later one's first token reads the
    # fixed point the chunk before ended on, and its other tokens (unknown yet) read zeros.
    assert read[0] is None and len(read) == 3
    for chunk, previous in zip((1, 2), read[1:]):
        ended_on = model.solve_fixed_point(TOKENS[:, : 4 * chunk])[1][:, -1]
        torch.testing.assert_close(previous[:, 0], ended_on, atol=1e-3, rtol=1e-3)
        assert not previous[:, 1:].any()
    torch.testing.assert_close(chunked.logits, from_zero, atol=1e-3, rtol=1e-3)
    # A state this model returned carries its last fixed point into the next call's first chunk.
    read.clear()
    with torch.no_grad():
        first = model(TOKENS[:, :6], use_cache=True)
        model(TOKENS[:, 6:], state=first.state)
    assert read[0] is None and torch.equal(read[1][:, 0], first.state.last_fixed_point)


@pytest.mark.parametrize("architecture", sorted(SMALL))
def test_a_guess_that_reads_the_state_reads_what_the_tokens_before_left(architecture):
    """Decoding token by token, each token's guess reads the state the tokens before it left
    (as the fit reads it at the fixed points); a chunk's first token reads the state the chunk
    before left, its other tokens (whose states are not known yet) zeros."""
    model = contractive(architecture)
    guess = fitted_guess(model, reads_state=True)
    model.attach_learned_guess(guess)
    embedded, z_star, _ = model.solve_fixed_point(TOKENS)
    queries = [torch.randn(*TOKENS.shape, width) for width, _ in model.stack.readout_sizes()]
    at_fixed_points = model.state_reader(embedded, z_star)(queries)
    seen = []
    original = guess.forward
    guess.forward = lambda embedded, previous=None, read_state=None: (seen.append(read_state)
                                                                       or original(embedded, previous, read_state))
    with torch.no_grad():
        model(TOKENS, mode="sequential")
    assert len(seen) == TOKENS.shape[1] and all(read is not None for read in seen)
    for t, read in enumerate(seen):
        for decoded, fitted in zip(read([query[:, t] for query in queries]), at_fixed_points):
            torch.testing.assert_close(decoded, fitted[:, t], atol=1e-4, rtol=1e-4)
    seen.clear()
    with torch.no_grad():
        model(TOKENS, chunk_length=4)
    assert seen[0] is None and len(seen) == 3
    for chunk, read in zip((1, 2), seen[1:]):
        reads = read([query[:, 4 * chunk:4 * chunk + 4] for query in queries])
        for chunk_reads, fitted in zip(reads, at_fixed_points):
            torch.testing.assert_close(chunk_reads[:, 0], fitted[:, 4 * chunk], atol=1e-4, rtol=1e-4)
            assert not chunk_reads[:, 1:].any()


def test_a_guess_that_reads_the_state_saves_passes_where_decoding_and_keeps_the_answers_in_bfloat16():
    model = contractive("mamba2")
    plain = fitted_guess(model)
    model.attach_learned_guess(plain)
    plain_passes = run(model, "sequential")[1].passes.float().mean()
    model.attach_learned_guess(fitted_guess(model, reads_state=True))
    logits, stats = run(model, "sequential")
    # Not a law: on this stack, the state holds what the previous fixed point does not.
    assert stats.passes.float().mean() < plain_passes
    model.to(torch.bfloat16)
    in_bfloat16, stats = run(model, "sequential")
    assert in_bfloat16.dtype == torch.bfloat16 and bool(stats.converged.all())
    torch.testing.assert_close(in_bfloat16.float(), logits, atol=0.05, rtol=0.05)  # bfloat16's rounding
    generated = model.generate(TOKENS[:, :6], max_new_tokens=6, do_sample=False)
    assert generated.shape == (3, 12) and model.generation_convergence["fp_not_converged"] == 0
