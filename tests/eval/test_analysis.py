"""Test-time compute, convergence statistics, perplexity by context length and the comparison
report: bookkeeping checked against hand computations, and the commands' records."""

from __future__ import annotations

import json
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from implicitlm.cli import main
from implicitlm.data.words import generate_words
from implicitlm.eval import plots
from implicitlm.eval.budget import budget_curves, budget_metrics, budget_sweep
from implicitlm.eval.convergence import convergence_summary, token_passes
from implicitlm.tasks.lm import perplexity, perplexity_by_length
from implicitlm.eval.records import make_record, write_record
from implicitlm.eval.report import find_records, markdown_tables, write_report
from implicitlm.models import build_model, config_from_options
from implicitlm.tasks.word_scoring import word_accuracy

from tests.support.contractive import make_contractive


def tiny_word_model(implicit: bool = True, vocab: int = 6, contractive: bool = False):
    torch.manual_seed(0)
    options = dict(
        architecture="mamba2", vocab_size=vocab, hidden_size=16, num_hidden_layers=2, state_size=8, head_dim=8,
        chunk_size=8, implicit=implicit, label_alignment="aligned",
    )
    model = build_model(config_from_options(options)).eval()
    return make_contractive(model) if contractive else model


def one_stack_pass_logits(model, input_ids):
    """f(0, u) through the head: what an implicit model with a budget of one iteration is."""
    embedded = model.embeddings(input_ids)
    injection = model.injection(model.injection_norm(embedded))
    z = model.stack(torch.zeros_like(embedded), injection)[0]
    return F.linear(z, model.embeddings.weight)[..., : model.config.vocab_size]


@torch.no_grad()
def test_budget_one_is_one_pass_of_the_stack():
    model = tiny_word_model()
    inputs, targets = generate_words("S3", 10, 8, seed=3)
    x = torch.from_numpy(inputs.astype(np.int64))
    expected = one_stack_pass_logits(model, x)
    torch.testing.assert_close(model(x, max_iter=1).logits, expected, rtol=0, atol=0)
    row = budget_sweep(lambda m, t: [word_accuracy(model, inputs, targets, max_iter=m, tol=t)], [1])[0]
    truth = torch.from_numpy(targets.astype(np.int64))
    right = (expected.argmax(-1) == truth)[:, 1:]
    assert row["accuracy"] == right.sum().item() / right.numel()  # counted exactly, not a float32 mean
    assert row["fp_passes_mean"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_more_budget_never_reports_fewer_iterations(mode):
    model = tiny_word_model(contractive=True)
    test_sets = [generate_words("S3", n, 8, seed=1) for n in (6, 12)]

    def evaluate(max_iter, tol):
        return [word_accuracy(model, i, t, mode=mode, max_iter=max_iter, tol=tol) for i, t in test_sets]

    rows = budget_sweep(evaluate, [8, 1, 2, 4, 16], tols=[0.03, 1e-4])
    for length in (6, 12):
        for tol in (0.03, 1e-4):
            used = [r["fp_passes_mean"] for r in rows if r["length"] == length and r["tol"] == tol]
            assert len(used) == 5 and used == sorted(used), used
            assert used[0] == 1.0
    # The tolerance is reached before the largest budget: the budget is not spent for nothing.
    final = [r["fp_passes_mean"] for r in rows if r["max_iter"] == 16 and r["tol"] == 0.03]
    assert all(1 < used < 16 for used in final)
    curves = budget_curves(rows, "accuracy")
    assert len(curves) == 4 and all(c["x"] == [1, 2, 4, 8, 16] for c in curves)
    assert "accuracy L6 it16 tol0.03" in budget_metrics(rows, "accuracy")


def test_budget_sweep_refuses_a_zero_budget():
    with pytest.raises(ValueError, match="positive"):
        budget_sweep(lambda m, t: [], [0, 4])


def test_convergence_summary_counts_and_splits():
    iterations = np.array([[1, 1, 2, 8], [8, 3, 1, 1]])
    residuals = np.array([[0.0, 0.0, 0.0, 0.5], [0.01, 0.0, 0.0, 0.0]])
    hard = np.array([[False, False, False, True], [True, False, False, False]])
    summary = convergence_summary(iterations, residuals, max_iter=8, tol=0.05, hard=hard)
    assert summary["all"]["histogram"]["tokens"] == [4, 1, 1, 0, 0, 0, 0, 2]
    assert summary["all"]["share_full_budget"] == 2 / 8
    assert summary["all"]["share_unconverged"] == 1 / 8
    assert summary["hard"]["share_full_budget"] == 1.0 and summary["hard"]["tokens"] == 2
    assert summary["easy"]["share_full_budget"] == 0.0 and summary["easy"]["passes_mean"] == 1.5
    assert summary["hard_share"] == 0.25
    with pytest.raises(ValueError, match="shape"):
        convergence_summary(iterations, residuals, 8, 0.05, hard[:1])


@torch.no_grad()
def test_token_passes_are_each_tokens_own():
    model = tiny_word_model(contractive=True)
    inputs, _ = generate_words("S3", 7, 5, seed=2)
    iterations, residuals, max_iter, tol = token_passes(model, inputs, max_iter=40, tol=0.01, batch_size=2)
    assert iterations.shape == (5, 7) and max_iter == 40 and tol == 0.01
    assert (iterations < 40).all() and (residuals < 0.01).all() and len(np.unique(iterations)) > 1
    # A token's count does not depend on its batch companions: one word alone gives the same.
    alone, _, _, _ = token_passes(model, inputs[3:4], max_iter=40, tol=0.01)
    np.testing.assert_array_equal(alone[0], iterations[3])
    # No float32 residual falls below 1e-12 in 4 evaluations: every token spends the budget.
    everything, _, _, _ = token_passes(model, inputs, max_iter=4, tol=1e-12)
    assert (everything == 4).all()
    with pytest.raises(ValueError, match="implicit"):
        token_passes(tiny_word_model(implicit=False), inputs)


class FixedCorpus:
    """Stands in for token shards: ``evaluation_windows`` only reads ``read`` and ``len``."""

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens, self.path, self.split = tokens, "corpus", "test"

    def __len__(self) -> int:
        return len(self.tokens)

    def read(self, start: int, length: int) -> np.ndarray:
        return self.tokens[start : start + length]


@torch.no_grad()
def test_perplexity_by_length_scores_the_same_tokens_at_every_length():
    model = tiny_word_model(vocab=16)
    corpus = FixedCorpus(np.random.default_rng(0).integers(0, 16, 400))
    rows = perplexity_by_length(model, corpus, [8, 16, 32], batch_size=3, max_tokens=96)
    assert [r["tokens"] for r in rows] == [96, 96, 96]
    windows = torch.from_numpy(corpus.tokens[: 3 * 33].astype(np.int64)).reshape(3, 33)
    assert rows[2]["loss"] == pytest.approx(perplexity(model, [windows])["loss"], rel=1e-6)
    assert all(r["fp_passes_mean"] >= 1 for r in rows)


def write_fake_run(folder, experiment, model, metrics, curves=None):
    axes = {"x": "length", "y": "accuracy"} if curves else None
    write_record(folder, make_record(experiment, folder / "checkpoint", model, metrics, curves, axes))


def test_report_tables_and_figures(tmp_path):
    implicit, explicit = tiny_word_model(), tiny_word_model(implicit=False)
    curve = [{"label": "simultaneous mode", "x": [8, 16], "y": [1.0, 0.9]}]
    write_fake_run(tmp_path / "imp", "word_length", implicit, {"accuracy@8": 1.0, "accuracy@16": 0.9}, curve)
    write_fake_run(tmp_path / "exp", "word_length", explicit, {"accuracy@8": 0.5, "accuracy@16": 0.25}, curve)
    write_fake_run(tmp_path / "imp" / "jac", "jacobian", implicit, {"off_diagonal_share_mean": 0.4})
    (tmp_path / "imp" / "notes.json").write_text(json.dumps({"not": "a record"}))
    entries = find_records([tmp_path / "imp", tmp_path / "exp"])
    assert sorted((e.label, e.record["experiment"]) for e in entries) == [
        (str(tmp_path / "exp"), "word_length"), (str(tmp_path / "imp"), "jacobian"), (str(tmp_path / "imp"), "word_length")
    ]
    tables = markdown_tables(entries)
    assert "| run | model | params (M) | accuracy@8 | accuracy@16 |" in tables
    assert f"| {tmp_path / 'exp'} | explicit mamba2 |" in tables and "| 0.5 | 0.25 |" in tables
    assert "## jacobian" in tables and "| 0.4 |" in tables
    # The curves as a table too: a row per run and curve, a column per x value.
    assert "| run | model | params (M) | 8 | 16 |" in tables
    assert f"| {tmp_path / 'imp'}: simultaneous mode | implicit mamba2 |" in tables
    report, figures = write_report([tmp_path / "imp", tmp_path / "exp"], tmp_path / "report")
    assert report.read_text().startswith("# Comparison report")
    assert sorted(f.name for f in figures) == ["jacobian.png", "word_length.png"]
    assert all(f.stat().st_size > 0 for f in figures)


def test_a_record_written_before_passes_had_one_name_reads_under_it(tmp_path):
    """An old record's "iterations" metrics (catbabi's fp_iterations_mean, a budget sweep's
    "iterations L8 it4") fall in the same report column as a new record's "passes" ones
    (before: a column for each name, each run's cell empty in the other's)."""
    model = tiny_word_model()
    write_fake_run(tmp_path / "old", "lm_budget", model, {"fp_iterations_mean": 7.0, "iterations L8 it4": 4.0})
    write_fake_run(tmp_path / "new", "lm_budget", model, {"fp_passes_mean": 5.0, "passes L8 it4": 3.0})
    entries = find_records([tmp_path / "old", tmp_path / "new"])
    assert [entry.record["metrics"] for entry in entries] == [{"fp_passes_mean": 7.0, "passes L8 it4": 4.0},
                                                              {"fp_passes_mean": 5.0, "passes L8 it4": 3.0}]
    tables = markdown_tables(entries)
    assert "| run | model | params (M) | fp_passes_mean | passes L8 it4 |" in tables and "iterations" not in tables

def test_report_bars_give_each_metric_its_own_scale_and_no_bar_where_a_run_lacks_it(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(plots, "save_figure", lambda figure, path: saved.append(figure) or path)
    runs = {"explicit": {"accuracy": 0.76}, "implicit": {"accuracy": 0.91, "fp_passes_mean": 257.0}}
    plots.plot_metric_panels(runs, tmp_path / "catbabi.png", "catbabi")
    axes = saved[0].axes
    assert [axis.get_title(loc="left") for axis in axes] == ["accuracy", "fp_passes_mean"]
    assert [[bar.get_width() for bar in axis.patches] for axis in axes] == [[0.76, 0.91], [257.0]]
    assert [tick.get_text() for tick in axes[1].get_yticklabels()] == ["implicit"]
    assert axes[0].get_xlim()[1] < 1.0 < 257.0 < axes[1].get_xlim()[1]  # accuracies not squashed by iterations


@pytest.mark.parametrize("draw", ["histograms", "learning_curves"])
def test_a_log_axis_reads_in_plain_numbers(tmp_path, monkeypatch, draw):
    """Before: the convergence histogram's shares read 10^-2 and 5x10^-3, the training perplexity 5x10^1."""
    saved = []
    monkeypatch.setattr(plots, "save_figure", lambda figure, path: saved.append(figure) or path)
    if draw == "histograms":
        shares = [0.6, 0.3, 0.08, 0.015, 0.005]
        plots.plot_histograms([{"label": "all", "x": [1, 2, 3, 4, 5], "y": shares}], tmp_path / "h.png", "passes", {})
    else:
        plots.plot_learning_curves({"run": [(1e5, 120.0), (2e5, 70.0), (4e5, 48.0)]}, tmp_path / "l.png", "ppl", "x", "y")
    saved[0].canvas.draw()
    labels = [text.get_text() for text in saved[0].axes[0].yaxis.get_ticklabels(which="both") if text.get_text()]
    plt.close(saved[0])
    assert labels and all(re.fullmatch(r"\d+(\.\d+)?", label) for label in labels), labels


def test_report_errors_name_the_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r")]) == 2
    assert "empty: no experiment results" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "missing: no such run folder" in capsys.readouterr().err


@pytest.mark.slow
def test_word_budget_and_convergence_commands(tmp_path, capsys, trained_s3):
    _, run = trained_s3
    checkpoint = str(run)  # a run folder: its latest checkpoint
    assert main(["eval", "budget", "--task", "words", checkpoint, "--lengths", "12,24", "--count", "16", "--max-iter", "1,4,16",
                 "--solver", "anderson", "--out", str(tmp_path / "budget"), "--no-progress"]) == 0
    record = json.loads((tmp_path / "budget" / "word_budget.json").read_text())
    assert record["model"]["solvers"] == {"simultaneous": "anderson", "sequential": "anderson"}
    assert [(r["length"], r["max_iter"]) for r in record["rows"]] == [(12, 1), (24, 1), (12, 4), (24, 4), (12, 16), (24, 16)]
    assert [c["label"] for c in record["curves"]] == ["length 12", "length 24"]
    assert (tmp_path / "budget" / "word_budget.png").stat().st_size > 0
    # A model of a direct product, whose first factor splits the tokens into hard and easy.
    product = tmp_path / "product"
    assert main(["words", "train", "--out", str(product), "--no-progress", "--model", "hidden_size=16",
                 "--model", "state_size=8", "--model", "head_dim=8", "--train", "group=Z3xZ2", "--train", "hard_prob=0.5",
                 "--train", "sequence_length=6", "--train", "batch_size=8", "--train", "total_steps=2"]) == 0
    checkpoint = str(product)
    assert main(["words", "convergence", checkpoint, "--hard-prob", "0.5", "--lengths", "12",
                 "--count", "8", "--max-iter", "20", "--tol", "1e-3", "--out", str(tmp_path / "conv"), "--no-progress"]) == 0
    summary = json.loads((tmp_path / "conv" / "convergence.json").read_text())["summary"]
    assert summary["all"]["tokens"] == 96 and summary["hard"]["tokens"] + summary["easy"]["tokens"] == 96
    assert sum(summary["all"]["histogram"]["tokens"]) == 96
    assert "hard" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "budget"), str(tmp_path / "conv"), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "convergence.png").is_file() and (tmp_path / "report" / "word_budget.png").is_file()


def test_budget_of_an_explicit_model_is_a_clean_error(tmp_path, capsys):
    model = tiny_word_model(implicit=False)
    model.save_pretrained(tmp_path / "explicit")
    code = main(["eval", "budget", "--task", "words", str(tmp_path / "explicit"), "--group", "S3", "--lengths", "8",
                 "--out", str(tmp_path / "o")])
    assert code == 2 and "explicit" in capsys.readouterr().err


@pytest.mark.slow
def test_a_word_passes_sweep_draws_a_curve_per_test_length(tmp_path, trained_s3):
    """Before: the word task's test sets are windows, not lengths, and every curve came out empty."""
    _, run = trained_s3
    assert main(["eval", "budget", "--task", "words", str(run), "--lengths", "12,24", "--count", "16", "--passes", "1,2",
                 "--out", str(tmp_path / "passes"), "--no-progress"]) == 0
    record = json.loads((tmp_path / "passes" / "word_budget_passes.json").read_text())
    assert [(c["label"], c["x"]) for c in record["curves"]] == [("length 12", [1, 2]), ("length 24", [1, 2])]
    assert all(len(c["y"]) == 2 for c in record["curves"])
