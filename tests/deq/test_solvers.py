"""Every solver in both inference modes: the same fixed point, per-sample freezing, a
sample's answer independent of its batch, frozen samples not recomputed in sequential
mode, and the solver named in the convergence metrics."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tests.support.models import contractive_model, token_ids
from tests.support.learned_solver import mixing_for
from implicitlm.cli import main
from implicitlm.data.words import generate_words
from implicitlm.deq import Budget, FixedPointOptions, FixedPointSolver, solve_sequence
from implicitlm.deq.options import SOLVERS
from implicitlm.core.schema import OptionError
from implicitlm.deq import solvers
from implicitlm.deq.solvers import get_solver
from implicitlm.eval.convergence import convergence_record, convergence_summary, token_passes

MODES = ("simultaneous", "sequential")


# ---------------------------------------------------------------- a per-sample toy problem


class ToyProblem:
    """f_i(z) = tanh(c_i Q z + b_i), Q orthogonal: sample i contracts with factor <= c_i.

    ``c`` and ``b`` are rows of data, so ``rows`` picks the same problems in any batch.
    """

    def __init__(self, factors: list[float], dim: int = 8, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.q = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))[0]
        self.bias = 0.5 * torch.randn(len(factors), dim, generator=gen, dtype=torch.float64)
        self.factor = torch.tensor(factors, dtype=torch.float64)[:, None]
        self.evaluated: list[torch.Tensor] = []  # the sample indices of each call

    def f(self, rows: torch.Tensor):
        def f_rows(z: torch.Tensor) -> torch.Tensor:
            self.evaluated.append(rows)
            return torch.tanh(self.factor[rows] * z @ self.q.T + self.bias[rows])

        return f_rows

    def solve(self, solver: str, rows: list[int], restricted: bool, max_iter: int = 500, tol: float = 1e-9):
        rows = torch.tensor(rows)
        restrict = (lambda active: self.f(rows[active])) if restricted else None
        z0 = torch.zeros(len(rows), self.q.shape[0], dtype=torch.float64)
        return FixedPointSolver(FixedPointOptions(solver=solver), mixing_for(solver))(
            self.f(rows), z0, Budget.to_tolerance(tol, max_iter), restrict=restrict)


def evaluations_per_sample(problem: ToyProblem, samples: int) -> list[int]:
    counts = torch.zeros(samples, dtype=torch.long)
    for rows in problem.evaluated:
        counts += torch.bincount(rows, minlength=samples)
    return counts.tolist()


def test_every_solver_name_resolves():
    assert all(callable(get_solver(name, mixing_for(name))) for name in SOLVERS)
    with pytest.raises(ValueError, match="unknown solver 'newton'"):
        get_solver("newton")


def test_the_options_and_every_solve_read_the_one_solver_table(monkeypatch):
    """Before: the options' names, our own solvers and torchdeq's lookup were three lists, and
    "learned_anderson" a branch of its own; now a solve runs what the table holds for its name."""
    assert SOLVERS == tuple(solvers._solvers) and "learned_anderson" in SOLVERS
    ran = []

    def spied(f, x0, max_iter, **options):
        ran.append(options["learned_mixing"])
        return plain(f, x0, max_iter, **options)

    plain = solvers._solvers["fixed_point_iter"]
    monkeypatch.setitem(solvers._solvers, "fixed_point_iter", spied)
    problem = ToyProblem([0.5, 0.9])
    z, stats = problem.solve("fixed_point_iter", [0, 1], restricted=True)
    assert ran == [None] and bool(stats.converged.all())


def test_a_registered_solver_is_got_by_its_name_with_the_mixing(monkeypatch):
    monkeypatch.setattr(solvers, "_solvers", dict(solvers._solvers))
    solvers.register_solver("newton", lambda f, x0, max_iter, **options: options["learned_mixing"])
    mixing = mixing_for("learned_anderson")
    assert "newton" in solvers.solver_names() and get_solver("newton", mixing)(None, None, 1) is mixing


def test_the_table_records_which_solvers_need_a_mixing_and_what_solves_in_their_place(monkeypatch):
    """A solver registered with ``without_mixing`` gets the model's mixing, is refused at its
    first solve without one (not when it is got: a model is built before its mixing is loaded),
    and names the solver that stands in for it; the others stand for themselves."""
    monkeypatch.setattr(solvers, "_solvers", dict(solvers._solvers))
    monkeypatch.setattr(solvers, "_without_mixing", dict(solvers._without_mixing))
    solvers.register_solver("learned_plain", lambda f, x0, max_iter, **options: options["learned_mixing"],
                            without_mixing="fixed_point_iter")
    assert [name for name in solvers.solver_names() if solvers.needs_mixing(name)] == ["learned_anderson", "learned_plain"]
    assert [solvers.without_mixing(name) for name in ("learned_plain", "learned_anderson", "broyden")] == [
        "fixed_point_iter", "safeguarded_anderson", "broyden"]
    mixing = mixing_for("learned_anderson")
    assert get_solver("learned_plain", mixing)(None, None, 1) is mixing
    unmixed = get_solver("learned_plain")
    with pytest.raises(OptionError, match="^solver 'learned_plain', but this model has no learned mixing"):
        unmixed(None, None, 1)
    with pytest.raises(OptionError, match="unknown solver 'newton'"):
        solvers.without_mixing("newton")


@pytest.mark.parametrize("solver", SOLVERS)
def test_converged_samples_are_frozen_and_not_evaluated_again(solver):
    problem = ToyProblem([0.3, 0.9, 0.6, 0.8])
    with torch.no_grad():
        z, stats = problem.solve(solver, [0, 1, 2, 3], restricted=True)
        evaluated = evaluations_per_sample(problem, 4)
        z_full, stats_full = problem.solve(solver, [0, 1, 2, 3], restricted=False)
    assert stats.converged.all() and stats.solver == solver
    assert len(set(stats.passes.tolist())) > 1  # different speeds: freezing matters
    # Each sample was computed exactly until it converged, then left out of the calls ...
    assert evaluated == stats.passes.tolist()
    assert stats.row_passes == stats.passes.sum().item()
    assert stats.batch_passes == stats.passes.max().item()  # ... and the batch stopped with the last
    # Computed on the whole batch and dropped instead: the same answers, at the full cost.
    torch.testing.assert_close(z_full, z, rtol=0, atol=0)
    assert stats_full.passes.tolist() == stats.passes.tolist()
    assert stats_full.row_passes == 4 * stats_full.batch_passes


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_sample_gets_the_same_answer_alone_as_in_a_batch(solver):
    problem = ToyProblem([0.3, 0.9, 0.6, 0.8])
    with torch.no_grad():
        z, stats = problem.solve(solver, [0, 1, 2, 3], restricted=False)
        for i in range(4):
            z_alone, stats_alone = problem.solve(solver, [i], restricted=False)
            torch.testing.assert_close(z[i : i + 1], z_alone, rtol=1e-13, atol=1e-13)
            assert stats.passes[i] == stats_alone.passes[0]
            assert stats.rel_residual[i].item() == pytest.approx(stats_alone.rel_residual[0].item(), rel=1e-9)


@pytest.mark.parametrize("solver", SOLVERS)
def test_every_solver_keeps_to_the_budget(solver):
    problem = ToyProblem([0.95, 0.3])
    with torch.no_grad():
        _, stats = problem.solve(solver, [0, 1], restricted=True, max_iter=3, tol=1e-14)
    assert len(problem.evaluated) == stats.batch_passes == 3
    assert stats.passes.tolist() == [3, 3] and not stats.converged.any()


def test_safeguarded_anderson_needs_far_fewer_passes_on_a_slow_map():
    problem = ToyProblem([1.0, 0.99])
    with torch.no_grad():
        z_plain, plain = problem.solve("fixed_point_iter", [0, 1], restricted=False, max_iter=2000)
        z_anderson, anderson = problem.solve("safeguarded_anderson", [0, 1], restricted=False)
    assert plain.converged.all() and anderson.converged.all()
    assert anderson.batch_passes * 3 < plain.batch_passes  # 30 against 117
    # Both within tol / (1 - c) of the fixed point.
    torch.testing.assert_close(z_anderson, z_plain, rtol=0, atol=1e-7)


# ---------------------------------------------------------------- sequential mode on a toy recurrence


@dataclasses.dataclass
class ToyState:
    h: torch.Tensor  # (B, D)
    sample: torch.Tensor  # (B,) which sample each row is, to count its steps


class ToyRecurrence:
    """z_t = tanh(0.8 W z_t + u_t + h_{t-1}), h_t = 0.5 h_{t-1} + z_t; counts steps per sample."""

    def __init__(self, dim: int = 6) -> None:
        gen = torch.Generator().manual_seed(3)
        weight = torch.randn(dim, dim, generator=gen, dtype=torch.float64)
        self.weight = 0.8 * weight / torch.linalg.matrix_norm(weight, ord=2)
        self.steps: list[torch.Tensor] = []

    def step(self, z, u, state: ToyState):
        self.steps.append(state.sample)
        z = torch.tanh(z @ self.weight.T + u + state.h)
        return z, ToyState(0.5 * state.h + z, state.sample)


def select_toy_rows(state: ToyState, rows: torch.Tensor) -> ToyState:
    return ToyState(state.h.index_select(0, rows), state.sample.index_select(0, rows))


def replace_toy_rows(state: ToyState, rows: torch.Tensor, new: ToyState) -> ToyState:
    return ToyState(state.h.index_copy(0, rows, new.h), state.sample.index_copy(0, rows, new.sample))


def run_toy_sequence(samples: list[int], solver: str = "fixed_point_iter"):
    recurrence = ToyRecurrence()
    gen = torch.Generator().manual_seed(4)
    injection = torch.randn(4, 5, 6, generator=gen, dtype=torch.float64)[samples]
    state = ToyState(torch.zeros(len(samples), 6, dtype=torch.float64), torch.tensor(samples))
    fp_solver = FixedPointSolver(FixedPointOptions(solver=solver), mixing_for(solver))
    with torch.no_grad():
        z, state, stats = solve_sequence(recurrence.step, injection, state, fp_solver, 6, Budget.to_tolerance(1e-10, 300),
                                         select_toy_rows, replace_toy_rows)
    return z, state, stats, recurrence.steps


@pytest.mark.parametrize("solver", ["fixed_point_iter", "safeguarded_anderson"])
def test_sequential_steps_only_the_samples_still_running(solver):
    z, state, stats, steps = run_toy_sequence([0, 1, 2, 3], solver)
    per_sample = torch.bincount(torch.cat(steps), minlength=4)
    # Each token: its own iterations (the state comes from the last of them: no commit
    # step); nothing for frozen samples.
    assert per_sample.tolist() == stats.passes.sum(dim=1).tolist()
    assert stats.row_passes == per_sample.sum().item() < 4 * stats.batch_passes
    for i in range(4):
        z_alone, state_alone, stats_alone, _ = run_toy_sequence([i], solver)
        torch.testing.assert_close(z[i : i + 1], z_alone, rtol=0, atol=1e-14)
        torch.testing.assert_close(state.h[i : i + 1], state_alone.h, rtol=0, atol=1e-14)
        assert torch.equal(stats.passes[i : i + 1], stats_alone.passes)


def test_the_kept_state_is_the_answers_own_pass():
    """The state a token hands on comes from the pass that gave its output: h_t = 0.5
    h_{t-1} + z_t exactly, for the returned z_t, which solves its equation to the tolerance."""
    z, state, _, _ = run_toy_sequence([0, 1, 2, 3])
    recurrence = ToyRecurrence()
    injection = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    h = torch.zeros(4, 6, dtype=torch.float64)
    for t in range(5):
        again = torch.tanh(z[:, t] @ recurrence.weight.T + injection[:, t] + h)
        assert ((again - z[:, t]).norm(dim=1) / again.norm(dim=1) < 1e-9).all()
        h = 0.5 * h + z[:, t]
    torch.testing.assert_close(state.h, h, rtol=0, atol=1e-15)


# ---------------------------------------------------------------- implicit Mamba2 and Llama


SIZES = {
    "mamba2": dict(state_size=8, head_dim=8, chunk_size=8),
    "llama": dict(num_attention_heads=2, num_key_value_heads=1, intermediate_size=32),
}


def solved_model(architecture: str = "mamba2", tol: float = 1e-6, max_iter: int = 300):
    return contractive_model(architecture=architecture, vocab_size=6, hidden_size=16, num_hidden_layers=1, implicit=True,
                             fixed_point=dict(max_iter=max_iter, tol=tol), **SIZES[architecture])


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["mamba2", "llama"])
def test_every_solver_reaches_the_same_fixed_point_in_both_modes(architecture):
    # torchdeq's anderson needs the large budget: its absolute regularisation (1e-4) swamps
    # residuals this small, and it ends up slower than plain iteration (~340 against ~140).
    model = solved_model(architecture, tol=1e-6, max_iter=1500)
    ids = token_ids(2, 6, seed=1, vocab=6)
    reference = None
    with torch.no_grad():
        for solver in SOLVERS:
            model.attach_learned_mixing(mixing_for(solver))
            model.set_fixed_point_options(solver=solver)
            for mode in MODES:
                out = model(ids, mode=mode)
                assert out.fixed_point.converged.all() and out.fixed_point.solver == solver, (solver, mode)
                reference = out.logits if reference is None else reference
                # Each within tol / (1 - c) ~ 1e-5 of z* (c ~ 0.9); the logits are ~0.1 at initialisation.
                torch.testing.assert_close(out.logits, reference, rtol=0, atol=1e-4 * reference.abs().max().item())


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("solver", SOLVERS)
def test_a_sequences_answer_does_not_depend_on_its_batch(solver, mode):
    model = solved_model(tol=1e-4)
    model.attach_learned_mixing(mixing_for(solver))
    model.set_fixed_point_options(solver=solver)
    ids = token_ids(4, 5, seed=2, vocab=6)
    with torch.no_grad():
        batch = model(ids, mode=mode)
        for i in range(4):
            alone = model(ids[i : i + 1], mode=mode)
            # Equal up to rounding (float64 products of another batch size; Broyden's secant
            # updates amplify it most): far below the ~1e-5 that one more iteration changes.
            torch.testing.assert_close(batch.logits[i : i + 1], alone.logits, rtol=0, atol=1e-10)
            assert torch.equal(batch.fixed_point.passes[i : i + 1], alone.fixed_point.passes)


def test_sequential_model_steps_only_the_rows_still_running():
    model = solved_model(tol=1e-6)
    ids = token_ids(4, 5, seed=2, vocab=6)
    step, rows_per_call = model.stack.step, []

    def counting_step(z, injection, states):
        rows_per_call.append(z.shape[0])
        return step(z, injection, states)

    model.stack.step = counting_step
    with torch.no_grad():
        stats = model(ids, mode="sequential").fixed_point
    # The solve's own steps (iterations), no commit step: the state comes from the answer's own pass.
    assert sum(rows_per_call) == stats.row_passes == stats.passes.sum().item()
    assert min(rows_per_call) < 4  # some calls ran on the unconverged rows only


@pytest.mark.slow
def test_simultaneous_model_passes_only_the_samples_still_running():
    model = solved_model(tol=1e-6)
    # Different lengths of left padding make the samples converge at different iterations.
    ids = token_ids(4, 6, seed=3, vocab=6)
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[1, :2] = mask[2, :4] = 0
    forward, rows_per_call = model.stack.forward, []

    def counting_forward(z, injection, states=None, padding=None):
        rows_per_call.append(z.shape[0])
        return forward(z, injection, states, padding)

    model.stack.forward = counting_forward
    with torch.no_grad():
        batch = model(ids, attention_mask=mask)
        model.stack.forward = forward
        for i in range(4):
            alone = model(ids[i : i + 1], attention_mask=mask[i : i + 1])
            torch.testing.assert_close(batch.logits[i : i + 1], alone.logits, rtol=0, atol=1e-10)
    stats = batch.fixed_point
    assert sum(rows_per_call) == stats.row_passes == stats.passes.sum().item()
    assert min(rows_per_call) < 4 and stats.row_passes < 4 * stats.batch_passes


# ---------------------------------------------------------------- the solver in the metrics


@pytest.mark.slow
def test_the_solver_is_named_in_the_summary_and_the_convergence_record(tmp_path):
    model = solved_model(tol=1e-4)
    inputs, _ = generate_words("S3", 6, 3, seed=1)
    model.set_fixed_point_options(solver="safeguarded_anderson")
    iterations, residuals, max_iter, tol = token_passes(model, inputs)
    assert model.solver.options.solver == "safeguarded_anderson" and (residuals < tol).all()
    summary = model(torch.as_tensor(inputs.astype("int64")), mode="sequential").fixed_point.summary()
    assert summary["fp_solver"] == "safeguarded_anderson" and summary["fp_row_passes"] > 0
    record = convergence_record(model, "random", convergence_summary(iterations, residuals, max_iter, tol), tmp_path, "t")
    assert record["solver"] == "safeguarded_anderson"
    assert json.loads((tmp_path / "convergence.json").read_text())["solver"] == "safeguarded_anderson"


@pytest.mark.slow
def test_convergence_command_takes_a_solver(tmp_path, capsys):
    solved_model(tol=1e-4).save_pretrained(tmp_path / "model")
    common = ["words", "convergence", str(tmp_path / "model"), "--group", "S3", "--lengths", "6", "--count", "4",
              "--no-progress"]
    assert main(common + ["--solver", "anderson", "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "convergence.json").read_text())["solver"] == "anderson"
    assert main(common + ["--solver", "newton", "--out", str(tmp_path / "bad")]) == 2
    assert "fixed-point option 'solver' must be one of" in capsys.readouterr().err


# ---------------------------------------------------------------- a solver per mode


@pytest.mark.slow
def test_each_mode_runs_its_own_solver_and_training_keeps_f_solver():
    model = solved_model(tol=1e-6)
    ids = token_ids(2, 6, seed=1, vocab=6)

    def solves(**options):
        model.set_fixed_point_options(solver="fixed_point_iter", simultaneous_solver="", sequential_solver="")
        model.set_fixed_point_options(**options)
        with torch.no_grad():
            return {mode: model(ids, mode=mode).fixed_point for mode in MODES}

    plain, anderson = solves(), solves(solver="safeguarded_anderson")
    assert anderson["sequential"].batch_passes < plain["sequential"].batch_passes  # the two differ here
    mixed = solves(sequential_solver="safeguarded_anderson")
    assert mixed["sequential"].solver == "safeguarded_anderson" and mixed["simultaneous"].solver == "fixed_point_iter"
    assert torch.equal(mixed["sequential"].passes, anderson["sequential"].passes)
    assert torch.equal(mixed["simultaneous"].passes, plain["simultaneous"].passes)
    swapped = solves(simultaneous_solver="safeguarded_anderson")
    assert torch.equal(swapped["simultaneous"].passes, anderson["simultaneous"].passes)
    assert torch.equal(swapped["sequential"].passes, plain["sequential"].passes)
    # Training solves with solver whatever the evaluation solvers say.
    assert FixedPointOptions(simultaneous_solver="anderson", sequential_solver="broyden").solver_for("training") \
        == "fixed_point_iter"


def test_an_unknown_mode_solver_is_refused_by_name():
    with pytest.raises(OptionError, match="fixed-point option 'sequential_solver' must be one of '', 'fixed_point_iter'"):
        FixedPointOptions(sequential_solver="newton")
    with pytest.raises(ValueError, match="phase must be one of training, simultaneous, sequential"):
        FixedPointSolver(FixedPointOptions())(lambda z: z, torch.zeros(1, 2), Budget.to_tolerance(1e-3, 3), phase="rnn")


def test_words_eval_takes_a_solver_for_every_solve(tmp_path):
    model = solved_model(tol=1e-4)
    model.set_fixed_point_options(sequential_solver="broyden")
    model.save_pretrained(tmp_path / "model")
    assert main(["words", "eval", str(tmp_path / "model"), "--group", "S3", "--lengths", "6", "--count", "4",
                 "--mode", "sequential", "--solver", "safeguarded_anderson", "--out", str(tmp_path / "out"),
                 "--no-progress"]) == 0
    record = json.loads((tmp_path / "out" / "word_length.json").read_text())
    assert record["model"]["solvers"] == {"simultaneous": "safeguarded_anderson", "sequential": "safeguarded_anderson"}
