"""``eval budget --passes``: quality and seconds at exactly K passes per solve, beside explicit
models scored on the same data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from implicitlm.cli import main
from implicitlm.data.shards import TokenShards
from implicitlm.eval import plots
from implicitlm.eval.budget import budget_by_task, cost_curves, format_passes_table, passes_by_task
from implicitlm.eval.flops import flops_per_token, solved_flops_per_token
from implicitlm.eval.length import evaluate_by_length
from implicitlm.models import load_model
from implicitlm.tasks import make_task

from tests.support.contractive import make_contractive
from tests.support.models import tiny_model


@pytest.fixture(scope="module")
def pair(shards, tmp_path_factory):
    """(implicit, explicit) one-block checkpoints over the shards' vocabulary."""
    root = tmp_path_factory.mktemp("pair")
    vocab = TokenShards(shards, "train").vocab_size
    for implicit in (True, False):
        model = tiny_model(
            architecture="mamba2", vocab_size=vocab, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8,
            chunk_size=8, implicit=implicit, fixed_point={"max_iter": 100, "tol": 1e-4})
        (make_contractive(model) if implicit else model).save_pretrained(root / ("implicit" if implicit else "explicit"))
    return root / "implicit", root / "explicit"


def budget(capsys, shards, implicit, out, *flags: str) -> tuple[int, list[str]]:
    code = main(["eval", "budget", "--task", "lm", str(implicit), "--data", str(shards), "--lengths", "8",
                 "--max-tokens", "64", "--no-progress", "--out", str(out), *flags])
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_sweep_of_passes_scores_each_k_beside_the_explicit_models(pair, shards, tmp_path, capsys):
    implicit, explicit = pair
    code = main(["eval", "budget", "--task", "lm", str(implicit), "--data", str(shards), "--lengths", "8",
                 "--max-tokens", "64", "--no-progress", "--out", str(tmp_path / "out"), "--passes", "1,2,3",
                 "--explicit", str(explicit)])
    assert code == 0
    table = capsys.readouterr().out.splitlines()
    record = json.loads((tmp_path / "out" / "lm_budget_passes.json").read_text())
    assert (tmp_path / "out" / "lm_budget_passes.png").stat().st_size > 0
    rows = record["rows"]
    assert [row["passes"] for row in rows] == [1, 2, 3] and all(row["seconds"] > 0 for row in rows)
    assert [row["fp_passes_mean"] for row in rows] == [1.0, 2.0, 3.0]
    assert len({row["perplexity"] for row in rows}) == 3  # each K its own answers
    [twin] = record["explicit"]
    assert twin["passes"] == "explicit" and twin["perplexity"] > 1 and "fp_passes_mean" not in twin
    assert record["curves"] == [{"label": "length 8", "x": [1, 2, 3], "y": [row["perplexity"] for row in rows]}]
    assert record["metrics"]["seconds L8 explicit"] == twin["seconds"]
    assert (tmp_path / "out" / "lm_budget_passes_time.png").stat().st_size > 0
    # Each pass costs the same FLOPs; the twin's one pass, without the injection, a little less than K = 1.
    flops = [row["flops_per_token"] for row in rows]
    assert flops[2] - flops[1] == pytest.approx(flops[1] - flops[0]) and flops[1] > flops[0] > twin["flops_per_token"] > 0
    assert (tmp_path / "out" / "lm_budget_passes_flops.png").stat().st_size > 0
    # Each K's answers by their last pass's residual, no share of misses of a tolerance no K holds.
    assert table[1].split()[-2:] == ["last", "residual"] and all("%" not in line for line in table)
    assert [line.split()[-1] for line in table[2:6]] == [f"{row['fp_last_residual_mean']:.2e}" for row in rows] + ["-"]
    assert [line.split()[-2] for line in table[2:6]] == [f"{value:.3e}" for value in flops + [twin["flops_per_token"]]]


def test_the_fixed_point_is_a_point_of_the_frontier_at_the_flops_of_the_passes_it_took(pair, shards, tmp_path, capsys):
    """``--fixed-point``: the model solved to its tolerance, scored as an evaluation to the
    tolerance scores it, at what its passes cost."""
    implicit, _ = pair
    code = main(["eval", "budget", "--task", "lm", str(implicit), "--data", str(shards), "--lengths", "8",
                 "--max-tokens", "64", "--no-progress", "--out", str(tmp_path / "out"), "--passes", "1,2",
                 "--fixed-point"])
    assert code == 0
    table = capsys.readouterr().out.splitlines()
    record = json.loads((tmp_path / "out" / "lm_budget_passes.json").read_text())
    [solved] = record["solved"]
    [alone] = evaluate_by_length(make_task("lm", implicit, data=[shards], lengths=[8], max_tokens=64)
                                 .solve_with(passes=0))["rows"]
    assert (solved["perplexity"], solved["fp_passes_mean"]) == (alone["perplexity"], alone["fp_passes_mean"])
    one, two = (row["flops_per_token"] for row in record["rows"])
    assert solved["flops_per_token"] == pytest.approx(one + (solved["fp_passes_mean"] - 1) * (two - one))
    assert table[1].split()[-1] == "resid.|missed" and table[4].split()[1:3] == ["fixed", "point"]
    assert table[4].endswith(f"{solved['fp_not_converged_share']:.2%}")


@pytest.mark.parametrize("mode, chunk_length", [("simultaneous", 0), ("simultaneous", 4), ("sequential", 0)])
def test_a_solve_s_flops_are_its_passes_flops(mode, chunk_length):
    """What a solve to the tolerance counts, from its mean passes, is what a count of that
    many passes gives: in chunks, a sample's passes are every chunk's together."""
    model = make_contractive(tiny_model(architecture="mamba2", vocab_size=12, hidden_size=16, num_hidden_layers=1,
                                        state_size=8, head_dim=8, chunk_size=4, implicit=True)).eval()
    settings = {"chunk_length": chunk_length}
    three = flops_per_token(model, mode, 8, {**settings, "passes": 3})
    chunks = 2 if chunk_length else 1
    assert solved_flops_per_token(model, mode, 8, settings, 3.0 * chunks) == pytest.approx(three)
    assert flops_per_token(model, mode, 8, {**settings, "passes": 1}) < three


def test_the_passes_figures_tell_the_explicit_lines_apart_and_read_their_log_axes_in_plain_numbers(
        pair, shards, tmp_path, capsys, monkeypatch):
    """Before: each explicit model's line was the same grey dash, and the log axes read 5x10^1."""
    drawn = {}
    monkeypatch.setattr(plots, "save_figure", lambda figure, path: drawn.setdefault(Path(path).name, figure))
    implicit, explicit = pair
    assert main(["eval", "budget", "--task", "lm", str(implicit), "--data", str(shards), "--lengths", "8,16",
                 "--max-tokens", "64", "--no-progress", "--out", str(tmp_path / "out"), "--passes", "1,2",
                 "--explicit", str(explicit)]) == 0
    axis = drawn["lm_budget_passes.png"].axes[0]
    references = [line for line in axis.get_lines() if line.get_label().startswith("explicit (one pass)")]
    assert [line.get_label().split(":")[0] for line in references] == [
        "explicit (one pass), length 8", "explicit (one pass), length 16"]
    assert references[0].get_color() != references[1].get_color()
    assert references[0].get_linestyle() != references[1].get_linestyle()
    legend = [text.get_text() for text in axis.get_legend().get_texts()]
    assert all(line.get_label() in legend for line in references)
    try:
        for name, figure in drawn.items():
            figure.canvas.draw()  # tick labels are written at drawing time
            for axis in figure.axes:
                for ruler in (axis.xaxis, axis.yaxis):
                    assert ruler.get_scale() == "log", name  # both figures are log-log
                    labels = [text.get_text() for text in ruler.get_ticklabels(which="both") if text.get_text()]
                    assert labels and all(re.fullmatch(r"\d+(\.\d+)?", label) for label in labels), (name, labels)
    finally:
        for figure in drawn.values():
            plt.close(figure)


def test_the_time_figure_puts_each_k_and_each_explicit_model_at_its_seconds():
    rows = [{"length": 8, "passes": k, "seconds": 0.1 * k, "perplexity": 10.0 / k} for k in (1, 2)]
    twins = [{"length": 8, "passes": "explicit", "seconds": 0.05, "perplexity": 7.0}]
    assert cost_curves(rows, twins, "perplexity") == [
        {"label": "implicit, 1, 2 passes, length 8", "x": [0.1, 0.2], "y": [10.0, 5.0]},
        {"label": "explicit, length 8", "x": [0.05], "y": [7.0]},
    ]


def test_a_passes_sweep_refuses_a_time_figure_already_there(pair, shards, tmp_path, capsys):
    implicit, _ = pair
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "lm_budget_passes_time.png").write_bytes(b"mine")
    code, err = budget(capsys, shards, implicit, tmp_path / "out", "--passes", "1")
    assert code == 2 and len(err) == 1 and "lm_budget_passes_time.png" in err[0]
    assert (tmp_path / "out" / "lm_budget_passes_time.png").read_bytes() == b"mine"
    assert not (tmp_path / "out" / "lm_budget_passes.json").exists()


@pytest.mark.parametrize("flags, message", [
    (["--explicit", "x"], "--explicit is drawn beside a sweep of --passes: give --passes"),
    (["--fixed-point"], "--fixed-point is drawn beside a sweep of --passes: give --passes"),
    (["--passes", "1,2", "--max-iter", "4"], "--passes (a sweep of fixed budgets) holds no tolerance to solve to, retry "
                                             "or miss: --max-iter is for a solve to the tolerance (--passes 0); give one "
                                             "or the other"),
    (["--passes", "1,2", "--tol", "1e-3", "--fail-on-nonconvergence"],
     "--passes (a sweep of fixed budgets) holds no tolerance to solve to, retry or miss: --tol, "
     "--fail-on-nonconvergence are for a solve to the tolerance (--passes 0)"),
    (["--passes", "0,2"], "argument --passes: expected comma-separated numbers of passes of 1 to 10000"),
])
def test_a_passes_sweep_mixed_with_a_tolerance_sweep_is_refused_in_one_line(pair, shards, tmp_path, capsys, flags,
                                                                            message):
    try:
        code, err = budget(capsys, shards, pair[0], tmp_path / "out", *flags)
    except SystemExit as parser_exit:
        code, err = parser_exit.code, capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_the_passes_table_keeps_its_header_over_its_columns():
    """Before: with no explicit model the column was as wide as "1" and its header pushed the others right."""
    rows = [{"length": 8, "passes": k, "seconds": 0.1, "perplexity": 10.0, "fp_not_converged_share": 0.0} for k in (1, 2)]
    header, *lines = format_passes_table(rows, "perplexity").splitlines()
    assert all(len(line) == len(header) for line in lines)
    assert header.index("perplexity") + len("perplexity") == lines[0].index("10.0000") + len("10.0000")


def test_a_sweep_hands_each_point_to_the_forwards_and_leaves_the_loaded_model_as_saved(pair, shards, tmp_path):
    """Each point of a sweep scores what an evaluation told that budget alone scores, and the
    model it loaded keeps the checkpoint's options (before: every point was set on the model,
    and on the task, the last one left there)."""
    implicit, _ = pair

    def lm_task():
        return make_task("lm", implicit, data=[shards], lengths=[8], max_tokens=64)

    saved = load_model(implicit).solver.options
    task = lm_task()
    by_passes = passes_by_task(task, [1, 3], out=tmp_path / "passes")["rows"]
    by_budget = budget_by_task(task, [2, 5], out=tmp_path / "budget")["rows"]
    assert task.fixed_point == {} and task.model.solver.options == saved
    for row in by_passes:
        [alone] = evaluate_by_length(lm_task().solve_with(passes=row["passes"]))["rows"]
        assert (row["perplexity"], row["fp_passes_mean"]) == (alone["perplexity"], alone["fp_passes_mean"])
    for row in by_budget:
        [alone] = evaluate_by_length(lm_task().solve_with(max_iter=row["max_iter"], passes=0))["rows"]
        assert (row["perplexity"], row["fp_passes_mean"]) == (alone["perplexity"], alone["fp_passes_mean"])
    assert [row["fp_passes_mean"] for row in by_passes] == [1.0, 3.0] and by_budget[0]["fp_passes_mean"] <= 2
    record = json.loads((tmp_path / "passes" / "lm_budget_passes.json").read_text())
    assert record["model"]["fixed_point"] == saved.to_dict()  # the task's settings: none, the model's own
