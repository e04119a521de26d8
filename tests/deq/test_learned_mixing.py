"""The learned mixing (solver "learned_anderson"): how the steps mix changes, the fixed point
does not; an untrained mixing is safeguarded Anderson exactly; a mixing whose steps fail
falls back to the least-squares step (its file: test_saved_network.py)."""

from __future__ import annotations

import pytest
import torch

from implicitlm.core.errors import OptionError
from implicitlm.deq import Budget, FixedPointOptions, FixedPointSolver
from implicitlm.deq.options import every_solve_by
from implicitlm.deq.solvers.anderson import MEMORY, safeguarded_anderson
from implicitlm.models.learned_solver import LearnedMixing

from tests.support.learned_solver import TOKENS, active_mixing, contractive, run
from tests.support.models import SMALL


def slow_map(dim: int = 16, factor: float = 0.97, seed: int = 0):
    """f(z) = tanh(factor Q z + b) per sample, Q orthogonal: a map plain iteration crawls on."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))[0]
    bias = 0.5 * torch.randn(3, dim, generator=generator, dtype=torch.float64)
    return lambda z: torch.tanh(factor * z @ q.T + bias)


def solve(f, solver: str, mixing: LearnedMixing | None = None, tol: float = 1e-10):
    z0 = torch.zeros(3, 16, dtype=torch.float64)
    return FixedPointSolver(FixedPointOptions(solver=solver), mixing)(f, z0, Budget.to_tolerance(tol, 500))


@pytest.mark.parametrize("architecture", sorted(SMALL))
@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_a_learned_mixing_reaches_the_fixed_point_of_safeguarded_anderson(architecture, mode):
    model = contractive(architecture)
    reference, reference_stats = run(model, mode)
    model.attach_learned_mixing(active_mixing())
    model.set_fixed_point_options(**every_solve_by("learned_anderson"))
    logits, stats = run(model, mode)
    assert bool(stats.converged.all()) and bool(reference_stats.converged.all())
    assert stats.solver == "learned_anderson" and reference_stats.solver == "safeguarded_anderson"
    # Both within the tolerance (1e-5) of the one fixed point: the logits agree to its order.
    torch.testing.assert_close(logits, reference, atol=1e-3, rtol=1e-3)
    assert not torch.equal(stats.passes, reference_stats.passes) or not torch.equal(logits, reference)


def test_an_untrained_mixing_is_safeguarded_anderson_exactly():
    f = slow_map()
    z_anderson, anderson = solve(f, "safeguarded_anderson")
    z_learned, learned = solve(f, "learned_anderson", LearnedMixing(MEMORY))
    assert torch.equal(z_learned, z_anderson) and torch.equal(learned.passes, anderson.passes)


@pytest.mark.parametrize("damping_bias", [-30.0, 30.0])  # damping ~0 (a stall) and ~2 (overshoot)
def test_a_mixing_whose_steps_fail_falls_back_to_the_least_squares_step(damping_bias):
    f = slow_map()
    bad = LearnedMixing(MEMORY)
    with torch.no_grad():
        bad.out.bias[-1] = damping_bias
    z_anderson, anderson = solve(f, "safeguarded_anderson")
    z_bad, fell_back = solve(f, "learned_anderson", bad)
    assert bool(fell_back.converged.all()) and bool(anderson.converged.all())
    # One failed learned step, then the least-squares steps from there: a pass or two more at most.
    assert (fell_back.passes <= anderson.passes + 2).all(), (fell_back.passes, anderson.passes)
    torch.testing.assert_close(z_bad, z_anderson, atol=1e-8, rtol=0)
    # Without the fallback the stalled mixing would not have converged in the budget: it is what saved it.
    if damping_bias < 0:
        proposed = []
        safeguarded_anderson(f, torch.zeros(3, 16, dtype=torch.float64), 3, mixing=bad, on_proposed=proposed.append)
        assert (proposed[0] - 0).abs().max() < 1e-6  # the first learned step barely moved: damping ~1e-13


def test_the_mixing_learns_from_each_steps_distance_to_the_fixed_point():
    f = slow_map()
    z_star, _ = solve(f, "safeguarded_anderson", tol=1e-12)
    mixing = LearnedMixing(MEMORY).double()

    def total_loss(backward: bool, steps: int = 6) -> float:
        """Each step's log distance to z*, back-propagated as it comes (as the fit does: the
        history the step's graph reads is overwritten by later steps, and the next step reads
        the iterate detached)."""
        losses = []

        def step_loss(x: torch.Tensor) -> None:
            loss = (x - z_star).norm(dim=1).log().mean()
            if backward:
                loss.backward()
            losses.append(loss.item())

        with torch.set_grad_enabled(backward):
            safeguarded_anderson(f, torch.zeros(3, 16, dtype=torch.float64), steps, mixing=mixing, on_proposed=step_loss)
        return sum(losses)

    total_loss(backward=True)
    # Every step's iterate depends on the mixing: its last layer (zero at first) gets a gradient.
    assert mixing.out.weight.grad.abs().sum() > 0 and mixing.out.bias.grad.abs().sum() > 0
    # Each step's gradient is that of its own loss, the history fixed: on the first step, whose
    # only history is z = 0, it matches a finite difference in the damping's bias exactly.
    mixing.zero_grad()
    total_loss(backward=True, steps=1)
    with torch.no_grad():
        mixing.out.bias[-1] = 1e-6
        above = total_loss(backward=False, steps=1)
        mixing.out.bias[-1] = -1e-6
        below = total_loss(backward=False, steps=1)
    assert mixing.out.bias.grad[-1].item() == pytest.approx((above - below) / 2e-6, rel=1e-6)


def test_learned_anderson_without_a_mixing_is_refused_when_it_solves():
    model = contractive("mamba2")
    model.set_fixed_point_options(**every_solve_by("learned_anderson"))  # accepted: a loaded model gets its mixing after its options
    with pytest.raises(OptionError, match="no learned mixing"):
        run(model, "simultaneous")


def test_a_mixing_follows_the_models_dtype():
    model = contractive("mamba2")
    model.attach_learned_mixing(active_mixing())
    model.set_fixed_point_options(**every_solve_by("learned_anderson"))
    model.to(torch.bfloat16)
    for mode in ("simultaneous", "sequential"):
        logits, stats = run(model, mode)
        assert logits.dtype == torch.bfloat16 and bool(torch.isfinite(logits).all()), mode
    generated = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, 7)


@pytest.mark.parametrize("architecture", sorted(SMALL))
def test_the_maps_a_mixing_is_fitted_on_have_the_models_fixed_points(architecture):
    """``fixed_point_map`` (a simultaneous solve's map) and ``token_maps`` (sequential mode's,
    from the state the earlier tokens' fixed points leave) both leave z* where it is; the
    state a token map starts from reads as ``state_reader`` reads it at that token."""
    model = contractive(architecture)
    _, z_star, _ = model.solve_fixed_point(TOKENS)
    with torch.no_grad():
        with model.fixed_point_map(TOKENS) as (_, f):
            torch.testing.assert_close(f(z_star), z_star, atol=1e-4, rtol=1e-4)
        queries = [torch.randn(*TOKENS.shape, width) for width, _ in model.stack.readout_sizes()]
        reads = model.state_reader(model.embeddings(TOKENS), z_star)(queries)
        with model.token_maps(TOKENS, z_star, [0, 5, 11]) as maps:
            for t, (_, f_t, read_t) in zip([0, 5, 11], maps):
                torch.testing.assert_close(f_t(z_star[:, t]), z_star[:, t], atol=1e-4, rtol=1e-4)
                # A guess reads the state a token's map starts from as the fit reads it for all tokens.
                for read, at_t in zip(reads, read_t([query[:, t] for query in queries])):
                    torch.testing.assert_close(at_t, read[:, t], atol=1e-5, rtol=1e-5)
