"""Fixed-point options, per-sample solve, phantom gradient and unroll."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from implicitlm.deq import Budget, FixedPointOptions, FixedPointSolver, OptionError
from implicitlm.deq.kept_state import KeptState
from tests.support.host_reads import HostReads
from tests.support.solving import solved

# Tiny tensors: a second intra-op thread only adds synchronisation cost on a shared CPU.


DIM = 6
class TanhMap(nn.Module):
    """f(z) = tanh(gain * W z + bias + shift), per sample: Lipschitz constant <= gain, as ||W||_2 = 1.

    ``gain`` and ``bias`` are rows of data, so a sample is the same problem in any batch.
    """

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        weight = torch.randn(DIM, DIM, generator=gen, dtype=torch.float64)
        self.weight = nn.Parameter(weight / torch.linalg.matrix_norm(weight, ord=2))
        self.shift = nn.Parameter(0.05 * torch.randn(DIM, generator=gen, dtype=torch.float64))

    def forward(self, z: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.tanh(gain * (z @ self.weight.T) + bias + self.shift)


def problems(gains, seed: int = 1):
    """One row of (gain, bias) per sample; a larger gain is a slower sample."""
    gen = torch.Generator().manual_seed(seed)
    gain = torch.tensor(gains, dtype=torch.float64)[:, None]
    bias = 0.3 * torch.randn(len(gains), DIM, generator=gen, dtype=torch.float64)  # tanh near linear
    return gain, bias


def batch_map(gains, seed: int = 1):
    f_map = TanhMap()
    gain, bias = problems(gains, seed)
    return lambda z: f_map(z, gain, bias)


def residuals(f, z):
    fz = f(z)
    abs_res = (fz - z).flatten(1).norm(dim=1)
    return abs_res, abs_res / fz.flatten(1).norm(dim=1)


def first_step_under(f, z0, tol, mode, budget=300):
    """Plain iteration by hand: per sample, the first step k with ||z_k - z_{k-1}|| under tol."""
    z, first = z0, [None] * z0.shape[0]
    for k in range(1, budget + 1):
        fz = f(z)
        abs_res = (fz - z).flatten(1).norm(dim=1)
        res = abs_res if mode == "abs" else abs_res / fz.flatten(1).norm(dim=1)
        for i, r in enumerate(res):
            if first[i] is None and r < tol:
                first[i] = k
        z = fz
    return first


# ---------------------------------------------------------------- options


def test_unknown_key_names_the_closest_option():
    with pytest.raises(OptionError, match="unknown fixed-point option 'stop_modes' \\(did you mean 'stop_mode'\\?\\)"):
        FixedPointOptions.from_dict({"train_tol": 0.05, "stop_modes": "abs"})
    with pytest.raises(OptionError, match="'train_max_iters'.*'train_max_iter'"):
        FixedPointOptions().replace(train_max_iters=8)


def test_unknown_key_without_close_match_lists_known_options():
    with pytest.raises(OptionError, match="known: solver, train_max_iter"):
        FixedPointOptions.from_dict({"zzz": 1})


@pytest.mark.parametrize(
    "field, value",
    [
        ("stop_mode", "max"),
        ("solver", "newton"),
        ("train_max_iter", -1),
        ("unroll_steps", -2),
        ("phantom_steps", 0),
        ("max_iter", 0),
        ("train_tol", 0.0),
        ("tol", -1e-3),
        ("tau", 0.0),
        ("tau", 1.5),
        ("tau", "0.8"),
        ("train_max_iter", 4.0),
        ("train_max_iter", True),
        ("phantom_steps", False),
        ("train_tol", True),
        ("train_tol", "0.05"),
    ],
)
def test_invalid_values_are_rejected(field, value):
    with pytest.raises(OptionError, match=field):
        FixedPointOptions(**{field: value})
    with pytest.raises(OptionError, match=field):
        FixedPointOptions().replace(**{field: value})


def test_bool_tau_is_rejected():
    with pytest.raises(OptionError, match="tau"):
        FixedPointOptions(tau=True)


def test_options_are_frozen_and_round_trip():
    options = FixedPointOptions(train_max_iter=24, phantom_steps=4, train_tol=0.05, stop_mode="abs")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.train_max_iter = 1
    assert FixedPointOptions.from_dict(options.to_dict()) == options
    assert options.replace(tau=1.0).tau == 1.0 and options.tau == 0.8
    assert FixedPointOptions(train_max_iter=0).train_max_iter == 0  # a phantom step from z0 alone is allowed


# ---------------------------------------------------------------- solve


@pytest.mark.parametrize("mode", ["rel", "abs"])
def test_solve_reaches_tolerance_per_sample(mode):
    f = batch_map([0.2, 0.6, 0.9])
    tol = 1e-8
    solver = FixedPointSolver(FixedPointOptions(stop_mode=mode))

    with torch.no_grad():
        z, stats = solver(f, torch.zeros(3, DIM, dtype=torch.float64), Budget.to_tolerance(tol, 300))
        abs_res, rel_res = residuals(f, z)

    true_res = abs_res if mode == "abs" else rel_res
    assert (true_res < tol).all()
    assert stats.converged.all() and stats.stop_mode == mode and stats.tol == tol
    reported = stats.abs_residual if mode == "abs" else stats.rel_residual
    assert (reported < tol).all()
    assert stats.passes.shape == (3,)
    # The slowest sample decides how many times f ran; faster samples need fewer steps.
    assert stats.batch_passes == stats.passes.max().item() < 300
    assert stats.passes[0] < stats.passes[1] < stats.passes[2]


@pytest.mark.parametrize("mode", ["rel", "abs"])
def test_slowest_sample_iterations_match_hand_count(mode):
    f = batch_map([0.2, 0.9])
    z0 = torch.zeros(2, DIM, dtype=torch.float64)
    with torch.no_grad():
        _, stats = FixedPointSolver(FixedPointOptions(stop_mode=mode))(f, z0, Budget.to_tolerance(1e-8, 300))
        expected = first_step_under(f, z0, 1e-8, mode)
    assert stats.passes[1].item() == expected[1] == stats.batch_passes


@pytest.mark.parametrize("mode", ["rel", "abs"])
def test_every_sample_iterations_match_hand_count(mode):
    f = batch_map([0.2, 0.6, 0.9])
    z0 = torch.zeros(3, DIM, dtype=torch.float64)
    with torch.no_grad():
        _, stats = FixedPointSolver(FixedPointOptions(stop_mode=mode))(f, z0, Budget.to_tolerance(1e-8, 300))
        expected = first_step_under(f, z0, 1e-8, mode)
    assert stats.passes.tolist() == expected


@pytest.mark.parametrize("solver", ["fixed_point_iter", "safeguarded_anderson"])
@pytest.mark.parametrize("keeps_state", [False, True])
def test_a_solve_reads_its_device_once_per_evaluation_and_once_per_sample_it_retires(solver, keeps_state):
    """A host read is a host sync on a GPU: whether a sample is done is the one thing the loop
    must know on the host; the best image, the residuals and the flags are kept by masks."""
    f_map, (gain, bias) = TanhMap(), problems([0.2, 0.6, 0.9])

    def f(z, rows=slice(None)):
        return f_map(z, gain[rows], bias[rows])

    kept = KeptState(lambda rows: lambda z: (f(z, slice(None) if rows is None else rows), [z.sum(-1)]),
                     lambda state, rows: [state[0].index_select(0, rows)],
                     lambda state, rows, new: [state[0].index_copy(0, rows, new[0])])
    with torch.no_grad(), HostReads() as reads:
        _, stats = FixedPointSolver(FixedPointOptions(solver=solver))(
            kept.f if keeps_state else f, torch.zeros(3, DIM, dtype=torch.float64), Budget.to_tolerance(1e-8, 300),
            restrict=kept.restrict if keeps_state else None, on_improved=kept.improved if keeps_state else None)
    assert stats.converged.all() and stats.batch_passes >= 10
    # One read per evaluation, one per sample retired (at most the batch), one at the end.
    assert reads.count <= stats.batch_passes + 3 + 1


def test_budget_caps_evaluations_and_reports_failure():
    f_map = TanhMap()
    gain, bias = problems([0.9])
    calls = []

    def f(z):
        calls.append(1)
        return f_map(z, gain, bias)

    with torch.no_grad():
        _, stats = FixedPointSolver(FixedPointOptions())(f, torch.zeros(1, DIM, dtype=torch.float64), Budget.to_tolerance(1e-12, 3))
    assert len(calls) == stats.batch_passes == 3
    assert stats.passes.tolist() == [3]
    assert not stats.converged.any()


def solve_with_fast_sample(slower_gains, tol):
    """Solve a batch of one fixed fast problem (gain 0.3) followed by ``slower_gains``."""
    f_map = TanhMap()
    gain, bias = problems([0.3], seed=1)
    if slower_gains:
        slower_gain, slower_bias = problems(slower_gains, seed=2)
        gain, bias = torch.cat([gain, slower_gain]), torch.cat([bias, slower_bias])
    f = lambda z: f_map(z, gain, bias)  # noqa: E731
    z0 = torch.zeros(len(gain), DIM, dtype=torch.float64)
    with torch.no_grad():
        z, stats = FixedPointSolver(FixedPointOptions())(f, z0, Budget.to_tolerance(tol, 300))
    return z, stats, f


def test_adding_slower_samples_leaves_a_fast_sample_frozen_where_it_converged():
    tol = 1e-6
    z_alone, stats_alone, _ = solve_with_fast_sample([], tol)
    z_batch, stats_batch, f = solve_with_fast_sample([0.9, 0.8], tol)

    assert stats_batch.batch_passes > stats_alone.batch_passes  # the others really are slower
    with torch.no_grad():
        _, rel_res = residuals(f, z_batch)
    assert rel_res[0] < tol  # meets the tolerance ...
    # ... and is frozen at the iterate where it did, as it is alone: the extra steps the
    # batch takes for its slower samples do not touch it.
    # Not bit-equal: a batch of three reduces in another order than a batch of one, and the
    # last bits of z differ on some CPUs (a residual of 4e-7 then moves by 5e-11 relative);
    # one more step would shrink it by ~0.3x.
    torch.testing.assert_close(z_batch[0], z_alone[0], rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(stats_batch.rel_residual[0], stats_alone.rel_residual[0], rtol=1e-6, atol=0)


def test_adding_faster_samples_leaves_a_slow_sample_unchanged():
    f_map = TanhMap()
    gain, bias = problems([0.9, 0.2, 0.4])
    z0 = torch.zeros(3, DIM, dtype=torch.float64)
    solver = FixedPointSolver(FixedPointOptions())
    with torch.no_grad():
        z_alone, stats_alone = solver(lambda z: f_map(z, gain[:1], bias[:1]), z0[:1], Budget.to_tolerance(1e-8, 300))
        z_batch, stats_batch = solver(lambda z: f_map(z, gain, bias), z0, Budget.to_tolerance(1e-8, 300))
    torch.testing.assert_close(z_batch[:1], z_alone, rtol=1e-14, atol=1e-14)
    assert stats_batch.passes[0] == stats_alone.passes[0]


def test_adding_slower_samples_keeps_a_fast_sample_iteration_count():
    _, stats_alone, _ = solve_with_fast_sample([], 1e-6)
    _, stats_batch, _ = solve_with_fast_sample([0.9, 0.8], 1e-6)
    assert stats_batch.passes[0] == stats_alone.passes[0]


def test_zero_budget_returns_start_without_calling_f():
    z0 = torch.randn(2, DIM, dtype=torch.float64)

    def f(z):
        raise AssertionError("f must not run with a zero budget")

    z, stats = FixedPointSolver(FixedPointOptions())(f, z0, Budget.exactly(0, 1e-3))
    assert z is z0
    assert stats.batch_passes == 0 and stats.passes.tolist() == [0, 0]
    assert not stats.converged.any()


def test_anderson_converges_to_the_same_fixed_point():
    f = batch_map([0.3, 0.9])
    z0 = torch.zeros(2, DIM, dtype=torch.float64)
    with torch.no_grad():
        z_and, stats_and = FixedPointSolver(FixedPointOptions(solver="anderson"))(f, z0, Budget.to_tolerance(1e-10, 100))
        z_fp, _ = FixedPointSolver(FixedPointOptions())(f, z0, Budget.to_tolerance(1e-10, 500))
        _, rel_res = residuals(f, z_and)
    assert (rel_res < 1e-10).all() and stats_and.converged.all()
    assert stats_and.batch_passes < 100
    torch.testing.assert_close(z_and, z_fp, rtol=0, atol=1e-8)


# ---------------------------------------------------------------- gradients


def parameter_grads(f_map: TanhMap, z: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    f_map.zero_grad()
    (z * weights).sum().backward()
    return [p.grad.clone() for p in f_map.parameters()]


def training_setup():
    f_map = TanhMap(seed=2)
    gain, bias = problems([0.5, 0.7], seed=3)
    z0 = torch.zeros(2, DIM, dtype=torch.float64)
    weights = torch.randn(2, DIM, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    return f_map, (lambda z: f_map(z, gain, bias)), z0, weights


@pytest.mark.parametrize("tau", [1.0, 0.5])
@pytest.mark.parametrize("steps", [1, 3])
def test_phantom_gradient_is_autograd_through_damped_steps(tau, steps):
    f_map, f, z0, weights = training_setup()
    options = FixedPointOptions(train_max_iter=6, train_tol=1e-12, phantom_steps=steps, tau=tau)
    solver = FixedPointSolver(options)

    z, stats = solved(solver, f, z0, training=True)
    grads = parameter_grads(f_map, z, weights)

    z_star, _ = solver(f, z0, Budget.to_tolerance(1e-12, 6))
    z_ref = z_star.detach()
    for _ in range(steps):
        z_ref = tau * f(z_ref) + (1 - tau) * z_ref
    grads_ref = parameter_grads(f_map, z_ref, weights)

    assert stats.batch_passes == 6  # the no-grad solve used its whole budget
    torch.testing.assert_close(z, z_ref, rtol=1e-14, atol=1e-14)
    for g, g_ref in zip(grads, grads_ref):
        assert g.abs().max() > 1e-3
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)


def test_damping_changes_the_phantom_gradient():
    def grads_for(tau):
        f_map, f, z0, weights = training_setup()
        options = FixedPointOptions(train_max_iter=6, train_tol=1e-12, phantom_steps=2, tau=tau)
        z, _ = solved(FixedPointSolver(options), f, z0, training=True)
        return parameter_grads(f_map, z, weights)

    assert not torch.allclose(grads_for(1.0)[0], grads_for(0.5)[0], rtol=1e-3)


def test_unroll_is_plain_autograd_through_n_steps():
    f_map, f, z0, weights = training_setup()
    solver = FixedPointSolver(FixedPointOptions(unroll_steps=3, train_max_iter=50))

    z, stats = solved(solver, f, z0, training=True)
    grads = parameter_grads(f_map, z, weights)

    z_ref = z0
    for _ in range(3):
        z_prev, z_ref = z_ref, f(z_ref)
    grads_ref = parameter_grads(f_map, z_ref, weights)

    assert stats.batch_passes == 3 and stats.passes.tolist() == [3, 3]
    with torch.no_grad():
        torch.testing.assert_close(stats.abs_residual, (z_ref - z_prev).norm(dim=1), rtol=1e-6, atol=0)
    torch.testing.assert_close(z, z_ref, rtol=0, atol=0)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)


def test_evaluation_uses_the_evaluation_budget_and_keeps_no_graph():
    f_map, f, z0, _ = training_setup()
    solver = FixedPointSolver(FixedPointOptions(train_max_iter=2, max_iter=5, tol=1e-14))
    z, stats = solved(solver, f, z0)
    assert stats.batch_passes == 5 and stats.tol == 1e-14
    assert not z.requires_grad
    _, stats = solved(solver, f, z0, max_iter=2, tol=1e-3)
    assert stats.batch_passes == 2 and stats.tol == 1e-3


def test_zero_solve_budget_in_training_takes_phantom_steps_from_z0():
    f_map, f, z0, weights = training_setup()
    z, stats = solved(FixedPointSolver(FixedPointOptions(train_max_iter=0, tau=1.0)), f, z0, training=True)
    assert stats.batch_passes == 0
    torch.testing.assert_close(z, f(z0), rtol=0, atol=0)


def test_a_calls_budget_is_its_own_where_given_else_the_options_of_its_phase():
    options = FixedPointOptions(train_max_iter=3, train_tol=0.1, max_iter=7, tol=0.5)
    assert options.budget(None, None) == (7, 0.5)
    assert options.budget(2, None) == (2, 0.5)
    assert options.budget(None, 0.25, "training") == (3, 0.25)
    assert options.budget(0, None, "training") == (0, 0.1)  # 0 is a budget, not "unset"
    assert options.budget(None, None, "simultaneous") == (7, 0.5)
    raised = options.replace(simultaneous_max_iter=40)
    assert (raised.budget(None, None, "simultaneous"), raised.budget(None, None, "sequential")) == ((40, 0.5), (7, 0.5))
    assert raised.budget(5, None, "simultaneous") == (5, 0.5)


def test_the_solver_s_budget_of_each_phase_and_a_budget_of_an_unknown_kind():
    """The one place a default budget is made: training's unroll or its solve to train_tol
    (each with the Jacobian penalty), an inference's exactly K passes or its solve to tol."""
    options = FixedPointOptions(train_max_iter=3, train_tol=0.1, max_iter=7, tol=0.5, jacobian_penalty=0.25)
    solver = FixedPointSolver(options)
    assert solver.budget("training") == Budget.to_tolerance(0.1, 3, 0.25)
    assert FixedPointSolver(options.replace(unroll_steps=4)).budget("training") == Budget.unrolled(4, 0.1, 0.25)
    assert solver.budget("sequential", max_iter=2) == Budget.to_tolerance(0.5, 2)
    assert FixedPointSolver(options.replace(passes=2)).budget("simultaneous") == Budget.exactly(2, 0.5)
    assert FixedPointSolver(options.replace(passes=2)).budget("simultaneous", passes=0) == Budget.to_tolerance(0.5, 7)
    assert Budget.probe() == Budget.to_tolerance(float("inf"), 1) and Budget.exactly(2, 0.5).fixed
    with pytest.raises(OptionError, match="a budget's kind is one of tolerance, passes, unrolled; got 'tolerence'"):
        Budget("tolerence", 3, 1e-3)
