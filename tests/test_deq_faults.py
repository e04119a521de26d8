"""Numerical faults in the fixed-point solve: budget misses and divergence counted, NaN
images kept out of the answer, and fatal non-convergence in evaluation only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from contractive import make_contractive
from implicitlm.cli import main
from implicitlm.deq import FixedPointOptions, FixedPointSolver, FixedPointStats, OptionError
from implicitlm.eval.convergence import convergence_metrics, convergence_summary
from implicitlm.faults import NumericalFault
from implicitlm.models import build_model, config_from_options

SLOPES = torch.tensor([1.5, 0.5, 1.5, 0.8])  # rows 0 and 2 diverge, 1 and 3 contract
DIVERGING = [0, 2]


def affine(slopes: torch.Tensor):
    """z -> a z + 1 per sample: fixed point 1 / (1 - a), reached for a < 1; for a > 1 the
    plain iteration from 0 grows geometrically, and so does its residual."""
    return lambda z: slopes.view(-1, 1, 1) * z + 1.0


def solver(**options) -> FixedPointSolver:
    return FixedPointSolver(FixedPointOptions(**{"eval_f_max_iter": 100, "eval_f_tol": 1e-6, **options}))


def solve(f, batch: int, training: bool = False, **options):
    return solver(**options)(f, torch.zeros(batch, 3, 2), training=training)


# ---------------------------------------------------------------- divergence


@pytest.mark.parametrize("stop_mode", ["abs", "rel"])
@pytest.mark.parametrize("restricted", [False, True])
def test_diverging_rows_stop_after_patience_plus_one_and_the_others_converge_as_alone(restricted, stop_mode):
    rows_seen = []

    def restrict(rows):
        rows_seen.append(rows.tolist())
        return affine(SLOPES[rows])

    z, stats = solver(divergence_patience=8, f_stop_mode=stop_mode)(
        affine(SLOPES), torch.zeros(4, 3, 2), training=False, restrict=restrict if restricted else None
    )
    assert stats.iterations[DIVERGING].tolist() == [9, 9]
    assert stats.diverged.tolist() == [True, False, True, False]
    assert stats.converged.tolist() == [False, True, False, True] and not stats.unconverged.any()
    # Divergence is read off the absolute residual (1, 1.5, 2.25, ... per entry) in both
    # stop modes; the image kept is the stop mode's lowest: in abs mode the first, f(0) = 1;
    # in rel mode, where |f(z) - z| / |f(z)| falls towards 1/3, the ninth, 2 (1.5^9 - 1).
    kept = 1.0 if stop_mode == "abs" else 2 * (1.5**9 - 1)
    torch.testing.assert_close(z[DIVERGING], torch.full((2, 3, 2), kept))
    alone_z, alone = solve(affine(SLOPES[[1, 3]]), 2, divergence_patience=8, f_stop_mode=stop_mode)
    assert torch.equal(z[[1, 3]], alone_z) and torch.equal(stats.iterations[[1, 3]], alone.iterations)
    assert stats.evaluations == alone.evaluations > 9  # the contracting rows set the batch's length
    if restricted:
        # Each row computed exactly as often as it was evaluated: the diverging ones 9 times.
        assert rows_seen[0] == [1, 3] and stats.row_evaluations == stats.iterations.sum() == 18 + alone.iterations.sum()
    summary = stats.summary()
    assert summary["fp_diverged"] == 2.0 and summary["fp_unconverged"] == 0.0


def test_patience_zero_lets_diverging_rows_spend_the_budget():
    z, stats = solve(affine(SLOPES), 4, divergence_patience=0, eval_f_max_iter=80, f_stop_mode="abs")
    assert stats.iterations[DIVERGING].tolist() == [80, 80] and not stats.diverged.any()
    assert stats.unconverged.tolist() == [True, False, True, False]
    assert torch.equal(z[DIVERGING], torch.ones(2, 3, 2))  # still the lowest-residual image
    assert stats.summary()["fp_unconverged"] == 2.0 and stats.summary()["fp_diverged"] == 0.0


def test_rises_that_do_not_double_the_residual_are_not_divergence():
    # The step length 1 + tanh(z / 10) / 2 rises at every step, but only from 1 towards 1.5.
    _, stats = solve(lambda z: z + 1 + torch.tanh(z / 10) / 2, 1, divergence_patience=8, f_stop_mode="abs")
    assert not stats.diverged.any() and stats.iterations.tolist() == [100] and stats.unconverged.all()
    # Slow but geometric: 5% per step doubles the step after 15 rises (1.05^14 = 1.98).
    _, stats = solve(affine(torch.tensor([1.05])), 1, divergence_patience=8)
    assert stats.diverged.all() and stats.iterations.tolist() == [16]
    # Patience 12 on x1.5: 11 rises are not enough, 12 are.
    _, stats = solve(affine(torch.tensor([1.5])), 1, divergence_patience=12)
    assert stats.diverged.all() and stats.iterations.tolist() == [13]


def test_a_sample_diverging_at_the_last_evaluation_has_hit_the_budget():
    _, stats = solve(affine(SLOPES), 4, divergence_patience=8, eval_f_max_iter=9)
    assert stats.iterations.tolist() == [9, 9, 9, 9]
    assert not stats.diverged.any() and stats.unconverged[DIVERGING].all()


# ---------------------------------------------------------------- NaN and Inf


def nan_after(calls: int, bad_rows: list[int], slope: float = 0.5):
    """z -> slope z + 1 for every row, but NaN (or Inf) in ``bad_rows`` from call ``calls`` on."""
    count = [0]

    def f(z):
        count[0] += 1
        out = slope * z + 1.0
        if count[0] >= calls:
            out = out.clone()
            out[bad_rows, 0, 0] = float("nan")
            out[bad_rows, 1, 1] = float("inf")
        return out

    return f


@pytest.mark.parametrize("name", ["fixed_point_iter", "anderson", "broyden", "safeguarded_anderson"])
def test_a_nan_image_freezes_its_sample_at_the_last_finite_one(name):
    # Call 3: every solver still iterating (Anderson and Broyden solve this linear map at that call).
    z, stats = solve(nan_after(3, [0, 2]), 4, f_solver=name, divergence_patience=8)
    assert torch.isfinite(z).all()
    assert stats.diverged.tolist() == [True, False, True, False] and stats.iterations[[0, 2]].tolist() == [3, 3]
    assert torch.isfinite(stats.abs_residual).all() and not stats.converged[[0, 2]].any()
    # The lowest-residual finite image: the second, f(1) = 1.5 (residual 0.5; the first's is 1).
    torch.testing.assert_close(z[[0, 2]], torch.full((2, 3, 2), 1.5))
    good_z, good = solve(nan_after(3, []), 4, f_solver=name)
    assert torch.equal(z[[1, 3]], good_z[[1, 3]]) and torch.equal(stats.iterations[[1, 3]], good.iterations[[1, 3]])
    assert stats.summary()["fp_diverged"] == 2.0 and stats.non_finite.tolist() == [True, False, True, False]
    assert good.summary()["fp_non_finite"] == 0.0


def test_a_sample_without_any_finite_image_is_a_numerical_fault():
    with pytest.raises(NumericalFault, match="every evaluation for 2 of 4 samples") as fault:
        solve(nan_after(1, [1, 3]), 4)
    assert "\n" not in str(fault.value)
    with pytest.raises(NumericalFault, match="1 of 4 samples"):  # in training as well: nothing to return
        solve(nan_after(1, [2]), 4, training=True, f_max_iter=3)


def test_non_finite_residuals_never_count_as_converged():
    residual = torch.tensor([float("nan"), float("inf"), 1e-9])
    for stop_mode in ("rel", "abs"):
        stats = FixedPointStats(
            iterations=torch.ones(3, dtype=torch.long), abs_residual=residual, rel_residual=residual,
            diverged=torch.zeros(3, dtype=torch.bool), non_finite=torch.zeros(3, dtype=torch.bool), evaluations=1,
            row_evaluations=3, tol=1e-3,
            stop_mode=stop_mode, solver="fixed_point_iter",
        )
        assert stats.converged.tolist() == [False, False, True]
        assert stats.summary()["fp_unconverged"] == 2.0
    iterations = np.array([3, 8, 8, 2])
    summary = convergence_summary(iterations, np.array([np.nan, np.inf, 1e-9, 0.5]), max_iter=8, tol=1e-3)
    assert summary["all"]["unconverged"] == 1 and summary["all"]["diverged"] == 2
    assert summary["all"]["share_unconverged"] == 0.75


# ---------------------------------------------------------------- fatal non-convergence


def test_fatal_nonconvergence_raises_in_evaluation_only():
    f = affine(torch.tensor([0.9, 0.01, 1.5, 0.1]))
    with pytest.raises(NumericalFault) as fault:
        solve(f, 4, eval_nonconvergence="error", eval_f_max_iter=12, divergence_patience=4)
    message = str(fault.value)
    assert "\n" not in message
    assert "2 of 4 samples" in message and "1 hit the budget of 12 evaluations" in message
    assert "1 diverged" in message and "vs tolerance 1e-06" in message
    # Evaluation with every sample converged, and training with a tiny budget: no error.
    solve(affine(torch.tensor([0.1, 0.2])), 2, eval_nonconvergence="error")
    z, stats = solve(f, 4, training=True, eval_nonconvergence="error", f_max_iter=2)
    assert stats.unconverged.all() and z.shape == (4, 3, 2)


def test_options_are_validated():
    assert FixedPointOptions().divergence_patience == 8 and FixedPointOptions().eval_nonconvergence == "report"
    with pytest.raises(OptionError, match="divergence_patience"):
        FixedPointOptions(divergence_patience=-1)
    with pytest.raises(OptionError, match="eval_nonconvergence"):
        FixedPointOptions(eval_nonconvergence="warn")
    with pytest.raises(OptionError, match="eval_nonconvergence"):
        FixedPointOptions.from_dict({"eval_nonconvergence": True})


# ---------------------------------------------------------------- models: per sample, per token


def mamba2_model(scale: float | None = None, contractive: bool = False):
    """A tiny implicit Mamba2; ``contractive``: made to converge; ``scale``: in_proj and
    out_proj weight scales multiplied by it (3: ten times the contractive 0.3, where some
    tokens' residuals run away)."""
    torch.manual_seed(0)
    options = dict(architecture="mamba2", vocab_size=6, hidden_size=16, num_hidden_layers=1, implicit=True,
                   state_size=8, head_dim=8, chunk_size=8, fixed_point=dict(eval_f_max_iter=60, eval_f_tol=1e-6))
    model = build_model(config_from_options(options)).double().eval()
    if contractive:
        make_contractive(model)
    if scale is not None:
        with torch.no_grad():
            for layer in model.stack.layers:
                for linear in (layer.mixer.in_proj, layer.mixer.out_proj):
                    linear.parametrizations.weight.original0.mul_(scale)
    return model


TOKENS = torch.randint(0, 6, (3, 5), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def test_sequential_mode_counts_per_token():
    model = mamba2_model(contractive=True)
    converged = model(TOKENS, mode="sequential", max_iter=300).fixed_point
    assert converged.diverged.shape == (3, 5) and converged.converged.all()
    assert converged.summary()["fp_unconverged"] == 0.0 and converged.summary()["fp_diverged"] == 0.0
    short = model(TOKENS, mode="sequential", max_iter=2).fixed_point
    assert short.summary()["fp_unconverged"] == 15.0 and (short.iterations == 2).all()
    simultaneous = model(TOKENS, max_iter=2).fixed_point
    assert simultaneous.summary()["fp_unconverged"] == 3.0  # per sample in simultaneous mode


@torch.no_grad()
def test_a_diverging_model_gives_up_tokens_early_with_the_same_answer():
    model = mamba2_model(scale=3.0)
    out = model(TOKENS, mode="sequential")
    stats = out.fixed_point
    diverged = stats.diverged
    assert diverged.any(), "the scaled model gives up no token"
    assert (stats.iterations[diverged] < 60).all() and not stats.converged[diverged].any()
    assert stats.summary()["fp_diverged"] == float(diverged.sum())
    model.set_fixed_point_options(divergence_patience=0)
    patient = model(TOKENS, mode="sequential")
    # Both return the lowest-residual image: the tokens given up never got better later.
    assert torch.equal(out.logits, patient.logits) and (patient.fixed_point.iterations[diverged] == 60).all()
    assert stats.row_evaluations < patient.fixed_point.row_evaluations
    model.set_fixed_point_options(divergence_patience=8, eval_nonconvergence="error")
    expected = rf"of 15 tokens: \d+ hit the budget of 60 evaluations, {int(diverged.sum())} diverged"
    with pytest.raises(NumericalFault, match=expected):
        model(TOKENS, mode="sequential")


@torch.no_grad()
def test_fatal_nonconvergence_in_a_model_is_for_evaluation_not_training():
    model = mamba2_model(contractive=True)
    model.set_fixed_point_options(eval_nonconvergence="error")
    with pytest.raises(NumericalFault, match="3 of 3 samples: 3 hit the budget of 1 evaluations"):
        model(TOKENS, max_iter=1)
    with pytest.raises(NumericalFault, match="15 of 15 tokens"):
        model(TOKENS, mode="sequential", max_iter=1)
    model.train()
    assert model(TOKENS).fixed_point.summary()["fp_unconverged"] == 3.0  # a training budget of 4: reported


@torch.no_grad()
def test_a_token_whose_map_is_nan_is_a_numerical_fault_in_sequential_mode():
    model = mamba2_model(contractive=True)
    model.embeddings.weight[TOKENS[1, 2]] = float("nan")
    with pytest.raises(NumericalFault, match=r"for \d of 3 samples"):
        model(TOKENS, mode="sequential")


# ---------------------------------------------------------------- convergence records and the command line


def test_the_convergence_summary_counts_budget_misses_and_divergence():
    iterations = np.array([[1, 3, 8, 8], [5, 8, 2, 1]])
    residuals = np.array([[0.0, 0.2, 0.5, 0.01], [0.3, 0.9, 0.0, 0.0]])
    hard = np.array([[False, True, True, False], [True, False, False, False]])
    summary = convergence_summary(iterations, residuals, max_iter=8, tol=0.05, hard=hard)
    assert summary["all"]["unconverged"] == 2 and summary["all"]["diverged"] == 2
    assert summary["hard"]["unconverged"] == 1 and summary["hard"]["diverged"] == 2
    metrics = convergence_metrics(summary)
    assert metrics["all unconverged"] == 2.0 and metrics["easy diverged"] == 0.0


def test_the_convergence_command_fails_on_nonconvergence_only_when_asked(tmp_path, capsys):
    mamba2_model(contractive=True).float().save_pretrained(tmp_path / "model", safe_serialization=True)
    common = ["words", "convergence", str(tmp_path / "model"), "--group", "S3", "--lengths", "6", "--count", "4",
              "--no-progress", "--max-iter", "1"]
    assert main(common + ["--out", str(tmp_path / "counted")]) == 0
    printed = capsys.readouterr().out
    assert "unconverged" in printed and "diverged" in printed
    record = json.loads((tmp_path / "counted" / "convergence.json").read_text())
    assert record["summary"]["all"]["unconverged"] == 24 and record["summary"]["all"]["diverged"] == 0
    assert record["metrics"]["all unconverged"] == 24.0
    assert main(common + ["--fail-on-nonconvergence", "--out", str(tmp_path / "fatal")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "24 of 24 tokens" in err[0] and "budget of 1 evaluations" in err[0], err
    assert "Traceback" not in err[0]
