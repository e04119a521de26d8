"""Numerical faults in the fixed-point solve: budget misses and divergence counted, NaN
images kept out of the answer, and fatal non-convergence in evaluation only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.support.contractive import make_contractive
from tests.support.solving import solved
from implicitlm.cli import main
from implicitlm.deq import ConvergenceTally, FixedPointOptions, FixedPointSolver, FixedPointStats, OptionError
from implicitlm.eval.convergence import convergence_metrics, convergence_summary
from implicitlm.tasks.lm import perplexity
from implicitlm.core.errors import NumericalFault
from implicitlm.models import build_model, config_from_options

SLOPES = torch.tensor([1.5, 0.5, 1.5, 0.8])  # rows 0 and 2 diverge, 1 and 3 contract
DIVERGING = [0, 2]


def affine(slopes: torch.Tensor):
    """z -> a z + 1 per sample: fixed point 1 / (1 - a), reached for a < 1; for a > 1 the
    plain iteration from 0 grows geometrically, and so does its residual."""
    return lambda z: slopes.view(-1, 1, 1) * z + 1.0


def solver(**options) -> FixedPointSolver:
    return FixedPointSolver(FixedPointOptions(**{"max_iter": 100, "tol": 1e-6, **options}))


def solve(f, batch: int, training: bool = False, **options):
    return solved(solver(**options), f, torch.zeros(batch, 3, 2), training=training)


# ---------------------------------------------------------------- divergence


@pytest.mark.parametrize("stop_mode", ["abs", "rel"])
@pytest.mark.parametrize("restricted", [False, True])
def test_diverging_rows_stop_once_far_beyond_their_first_step_and_the_others_converge_as_alone(restricted, stop_mode):
    rows_seen = []

    def restrict(rows):
        rows_seen.append(rows.tolist())
        return affine(SLOPES[rows])

    z, stats = solved(solver(divergence_patience=8, stop_mode=stop_mode), affine(SLOPES), torch.zeros(4, 3, 2),
                      restrict=restrict if restricted else None)
    # The step at evaluation n is 1.5^(n-1) per entry: above 100 times the first from n = 13
    # (1.5^12 = 130), so the 8th evaluation in a row that far out is the 20th.
    assert stats.passes[DIVERGING].tolist() == [20, 20]
    assert stats.diverged.tolist() == [True, False, True, False]
    assert stats.converged.tolist() == [False, True, False, True] and not stats.unconverged.any()
    # The image kept is the stop mode's lowest-residual one: in abs mode the first, f(0) = 1;
    # in rel mode, where |f(z) - z| / |f(z)| falls towards 1/3, the 20th, 2 (1.5^20 - 1).
    kept = 1.0 if stop_mode == "abs" else 2 * (1.5**20 - 1)
    torch.testing.assert_close(z[DIVERGING], torch.full((2, 3, 2), kept))
    alone_z, alone = solve(affine(SLOPES[[1, 3]]), 2, divergence_patience=8, stop_mode=stop_mode)
    assert torch.equal(z[[1, 3]], alone_z) and torch.equal(stats.passes[[1, 3]], alone.passes)
    assert stats.batch_passes == max(20, alone.batch_passes)
    if restricted:
        # Each row computed exactly as often as it was evaluated: the diverging ones 20 times.
        assert rows_seen[-1] == [3]  # the slowest to converge (x0.8 to 1e-6) runs last, alone
        assert stats.row_passes == stats.passes.sum() == 40 + alone.passes.sum()
    summary = stats.summary()
    assert summary["fp_diverged"] == 2.0 and summary["fp_unconverged"] == 0.0


def test_patience_zero_lets_diverging_rows_spend_the_budget():
    z, stats = solve(affine(SLOPES), 4, divergence_patience=0, max_iter=80, stop_mode="abs")
    assert stats.passes[DIVERGING].tolist() == [80, 80] and not stats.diverged.any()
    assert stats.unconverged.tolist() == [True, False, True, False]
    assert torch.equal(z[DIVERGING], torch.ones(2, 3, 2))  # still the lowest-residual image
    assert stats.summary()["fp_unconverged"] == 2.0 and stats.summary()["fp_diverged"] == 0.0


def test_growth_within_the_bound_is_not_divergence_and_the_bound_is_an_option():
    # The step length 1 + tanh(z / 10) / 2 rises at every step, but only from 1 towards 1.5.
    _, stats = solve(lambda z: z + 1 + torch.tanh(z / 10) / 2, 1, stop_mode="abs")
    assert not stats.diverged.any() and stats.passes.tolist() == [100] and stats.unconverged.all()
    # Slow but geometric: 5% per step is 100 times the first step from evaluation 96
    # (1.05^95 = 103), so patience 8 gives up at 103, past a budget of 100 but not of 200.
    _, stats = solve(affine(torch.tensor([1.05])), 1, divergence_patience=8)
    assert not stats.diverged.any() and stats.unconverged.all()
    _, stats = solve(affine(torch.tensor([1.05])), 1, divergence_patience=8, max_iter=200)
    assert stats.diverged.all() and stats.passes.tolist() == [103]
    # A bound of 10: x1.5 is beyond it from evaluation 7 (1.5^6 = 11.4); patience 12 ends at 18.
    _, stats = solve(affine(torch.tensor([1.5])), 1, divergence_patience=12, divergence_growth=10.0)
    assert stats.diverged.all() and stats.passes.tolist() == [18]


def travelling_front(length: int, gain: float):
    """A map shaped like simultaneous mode over a sequence: token t reads token t - 1 of the
    last iterate, so information moves one token per evaluation. Its step length grows by
    ``gain`` at each of the first ``length`` evaluations (the front carries more and more),
    then falls to exactly 0: a converging sample whose residual rises first."""

    def f(z):  # z: (batch, length, 1)
        shifted = torch.cat([torch.zeros_like(z[:, :1]), z[:, :-1]], dim=1)
        return gain * shifted + 1.0

    return f


def test_a_converging_sample_whose_step_grows_for_its_whole_length_is_not_given_up():
    # Its step grows at 27 evaluations in a row, about 5-fold, before it falls to exactly 0:
    # rises are how such a sample converges, not a sign that it diverges.
    length = 32
    f = travelling_front(length, 1.1)
    z, stats = solved(FixedPointSolver(FixedPointOptions(max_iter=64, tol=1e-6, stop_mode="abs")), f,
                      torch.zeros(2, length, 1))
    assert stats.converged.all() and not stats.diverged.any() and stats.passes.tolist() == [length + 1] * 2
    expected = torch.tensor([sum(1.1**k for k in range(t + 1)) for t in range(length)]).view(1, length, 1)
    torch.testing.assert_close(z, expected.expand(2, -1, -1))


def test_the_divergence_options_are_validated():
    with pytest.raises(OptionError, match="divergence_growth"):
        FixedPointOptions(divergence_growth=1.0)
    with pytest.raises(OptionError, match="divergence_growth"):
        FixedPointOptions(divergence_growth=float("inf"))
    with pytest.raises(OptionError, match="divergence_growth"):
        FixedPointOptions.from_dict({"divergence_growth": "100"})


def test_a_sample_diverging_at_the_last_evaluation_has_hit_the_budget():
    _, stats = solve(affine(SLOPES), 4, divergence_patience=8, max_iter=20)
    assert stats.passes.tolist() == [20, 20, 20, 20]
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
    z, stats = solve(nan_after(3, [0, 2]), 4, solver=name, divergence_patience=8)
    assert torch.isfinite(z).all()
    assert stats.diverged.tolist() == [True, False, True, False] and stats.passes[[0, 2]].tolist() == [3, 3]
    assert torch.isfinite(stats.abs_residual).all() and not stats.converged[[0, 2]].any()
    # The lowest-residual finite image: the second, f(1) = 1.5 (residual 0.5; the first's is 1).
    torch.testing.assert_close(z[[0, 2]], torch.full((2, 3, 2), 1.5))
    good_z, good = solve(nan_after(3, []), 4, solver=name)
    assert torch.equal(z[[1, 3]], good_z[[1, 3]]) and torch.equal(stats.passes[[1, 3]], good.passes[[1, 3]])
    assert stats.summary()["fp_diverged"] == 2.0 and stats.non_finite.tolist() == [True, False, True, False]
    assert good.summary()["fp_non_finite"] == 0.0


def test_a_sample_without_any_finite_image_is_a_numerical_fault():
    with pytest.raises(NumericalFault, match="every evaluation for 2 of 4 samples") as fault:
        solve(nan_after(1, [1, 3]), 4)
    assert "\n" not in str(fault.value)
    with pytest.raises(NumericalFault, match="1 of 4 samples"):  # in training as well: nothing to return
        solve(nan_after(1, [2]), 4, training=True, train_max_iter=3)


def test_non_finite_residuals_never_count_as_converged():
    residual = torch.tensor([float("nan"), float("inf"), 1e-9])
    for stop_mode in ("rel", "abs"):
        stats = FixedPointStats(
            passes=torch.ones(3, dtype=torch.long), abs_residual=residual, rel_residual=residual,
            diverged=torch.zeros(3, dtype=torch.bool), non_finite=torch.zeros(3, dtype=torch.bool), batch_passes=1,
            row_passes=3, tol=1e-3,
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
        solve(f, 4, nonconvergence="error", max_iter=12, divergence_patience=4, divergence_growth=2.0)
    message = str(fault.value)
    assert "\n" not in message
    assert "2 of 4 samples" in message and "1 hit the budget of 12 passes" in message
    assert "1 diverged" in message and "vs tolerance 1e-06" in message
    # Evaluation with every sample converged, and training with a tiny budget: no error.
    solve(affine(torch.tensor([0.1, 0.2])), 2, nonconvergence="error")
    z, stats = solve(f, 4, training=True, nonconvergence="error", train_max_iter=2)
    assert stats.unconverged.all() and z.shape == (4, 3, 2)


def test_options_are_validated():
    defaults = FixedPointOptions()
    assert defaults.divergence_patience == 16 and defaults.divergence_growth == 100.0
    assert defaults.nonconvergence == "report"
    with pytest.raises(OptionError, match="divergence_patience"):
        FixedPointOptions(divergence_patience=-1)
    with pytest.raises(OptionError, match="nonconvergence"):
        FixedPointOptions(nonconvergence="warn")
    with pytest.raises(OptionError, match="nonconvergence"):
        FixedPointOptions.from_dict({"nonconvergence": True})


# ---------------------------------------------------------------- models: per sample, per token


def mamba2_model(scale: float | None = None, contractive: bool = False):
    """A tiny implicit Mamba2; ``contractive``: made to converge; ``scale``: in_proj and
    out_proj weight scales multiplied by it (3: ten times the contractive 0.3, where some
    tokens' residuals run away)."""
    torch.manual_seed(0)
    options = dict(architecture="mamba2", vocab_size=6, hidden_size=16, num_hidden_layers=1, implicit=True,
                   state_size=8, head_dim=8, chunk_size=8, fixed_point=dict(max_iter=60, tol=1e-6))
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
    assert short.summary()["fp_unconverged"] == 15.0 and (short.passes == 2).all()
    simultaneous = model(TOKENS, max_iter=2).fixed_point
    assert simultaneous.summary()["fp_unconverged"] == 3.0  # per sample in simultaneous mode


@torch.no_grad()
def test_a_model_that_does_not_settle_spends_the_budget_and_is_counted_as_such():
    # Scaled up, some tokens' iterates wander without settling; the final norm bounds their
    # steps, so nothing runs away: they are budget misses, not divergence.
    model = mamba2_model(scale=3.0)
    with model.track_convergence() as tally:
        stats = model(TOKENS, mode="sequential").fixed_point
    missed = stats.unconverged
    assert missed.any() and not stats.diverged.any() and (stats.passes[missed] == 60).all()
    assert tally.as_dict() == {
        "fp_fixed_points": 15, "fp_not_converged": int(missed.sum()), "fp_not_converged_share": int(missed.sum()) / 15,
        "fp_stopped_at_budget": int(missed.sum()), "fp_diverged": 0, "fp_non_finite": 0, "fp_retried": 0,
        "fp_retry_passes_mean": 0.0,
    }
    model.set_fixed_point_options(nonconvergence="error")
    expected = rf"{int(missed.sum())} of 15 tokens: {int(missed.sum())} hit the budget of 60 passes, 0 diverged"
    with pytest.raises(NumericalFault, match=expected):
        model(TOKENS, mode="sequential")


@torch.no_grad()
def test_fatal_nonconvergence_in_a_model_is_for_evaluation_not_training():
    model = mamba2_model(contractive=True)
    model.set_fixed_point_options(nonconvergence="error")
    with pytest.raises(NumericalFault, match="3 of 3 samples: 3 hit the budget of 1 passes"):
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
    assert len(err) == 1 and "24 of 24 tokens" in err[0] and "budget of 1 passes" in err[0], err
    assert "Traceback" not in err[0]


# ---------------------------------------------------------------- never silent


def test_the_tally_counts_each_fixed_point_under_one_reason():
    tally = ConvergenceTally()
    stats = FixedPointStats(
        passes=torch.tensor([[3, 9], [9, 4]]), abs_residual=torch.tensor([[0.0, 1.0], [float("nan"), 2.0]]),
        rel_residual=torch.tensor([[0.0, 1.0], [float("nan"), 2.0]]), diverged=torch.tensor([[False, False], [True, True]]),
        non_finite=torch.tensor([[False, False], [True, False]]), batch_passes=9, row_passes=18, tol=1e-3,
        stop_mode="rel", solver="fixed_point_iter",
    )
    assert tally.warning("nothing yet") is None
    tally.add(stats)
    tally.add(stats)
    assert tally.as_dict() == {"fp_fixed_points": 8, "fp_not_converged": 6, "fp_not_converged_share": 0.75,
                               "fp_stopped_at_budget": 2, "fp_diverged": 2, "fp_non_finite": 2, "fp_retried": 0,
                               "fp_retry_passes_mean": 0.0}
    assert tally.warning("words") == ("words: 6 of 8 fixed points (75.00%) stopped above the tolerance: "
                                      "2 at the budget of passes, 2 diverged, 2 non-finite")


def test_generate_records_its_convergence_and_warns_in_one_line(caplog):
    model = mamba2_model(contractive=True)
    with caplog.at_level("WARNING", logger="implicitlm"):
        model.generate(TOKENS, max_new_tokens=3, max_iter=1)
    # The prefill (one fixed point per sequence) and two decoded tokens per sequence.
    assert model.generation_convergence["fp_fixed_points"] == 3 + 3 * 2
    assert model.generation_convergence["fp_stopped_at_budget"] == 9
    [line] = [record.getMessage() for record in caplog.records if record.name == "implicitlm"]
    assert line.startswith("generate: 9 of 9 fixed points (100.00%)") and "\n" not in line
    caplog.clear()
    with caplog.at_level("WARNING", logger="implicitlm"):
        model.generate(TOKENS, max_new_tokens=3, max_iter=300)
    assert model.generation_convergence["fp_not_converged"] == 0 and not caplog.records


def test_perplexity_reports_the_share_short_of_the_tolerance(caplog):
    model = mamba2_model(contractive=True)
    windows = [torch.randint(0, 6, (2, 9), generator=torch.Generator().manual_seed(2))]
    with caplog.at_level("WARNING", logger="implicitlm"):
        missed = perplexity(model, windows, mode="sequential", max_iter=1)
        settled = perplexity(model, windows, max_iter=300)
    assert missed["fp_fixed_points"] == 16 and missed["fp_not_converged_share"] == 1.0
    assert settled["fp_fixed_points"] == 2 and settled["fp_not_converged"] == 0
    assert [record.getMessage().split(":")[0] for record in caplog.records] == ["perplexity (sequential mode)"]
