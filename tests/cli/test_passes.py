"""``--passes K``: every inference command's fixed-pass budget, on top of what the checkpoint
declares, and recorded with the results."""

from __future__ import annotations

import json

import pytest
import torch

from implicitlm.cli import main
from implicitlm.data.shards import TokenShards
from implicitlm.models import build_model, config_from_options, load_model

from tests.support.contractive import make_contractive
from tests.support.cost_names import former_cost_names


@pytest.fixture(scope="module")
def checkpoint(shards, tmp_path_factory):
    """A contractive one-block implicit model over the shards' vocabulary, solved to 1e-4."""
    torch.manual_seed(0)
    options = dict(architecture="mamba2", vocab_size=TokenShards(shards, "train").vocab_size, hidden_size=16,
                   num_hidden_layers=1, state_size=8, head_dim=8, chunk_size=8,
                   fixed_point={"max_iter": 100, "tol": 1e-4})
    folder = tmp_path_factory.mktemp("passes") / "model"
    make_contractive(build_model(config_from_options(options))).save_pretrained(folder)
    return folder


def lm_eval(capsys, checkpoint, shards, out, *flags: str, table: list | None = None) -> dict:
    """The record of ``lm eval`` with ``flags``; ``table``: a list the printed lines go to."""
    argv = ["lm", "eval", str(checkpoint), "--data", str(shards), "--lengths", "8", "--max-tokens", "64",
            "--no-progress", "--out", str(out), *flags]
    assert main(argv) == 0
    if table is not None:
        table += capsys.readouterr().out.splitlines()
    capsys.readouterr()
    return json.loads((out / "lm_length.json").read_text())


@pytest.fixture(scope="module")
def declaring(checkpoint, tmp_path_factory):
    """The checkpoint saved declaring 2 passes, as a few-pass model ships."""
    folder = tmp_path_factory.mktemp("declaring") / "model"
    model = load_model(checkpoint)
    model.set_fixed_point_options(passes=2)
    model.save_pretrained(folder)
    return folder


def test_passes_change_the_scores_and_are_recorded(checkpoint, shards, tmp_path, capsys):
    tight = lm_eval(capsys, checkpoint, shards, tmp_path / "tight")
    one = lm_eval(capsys, checkpoint, shards, tmp_path / "one", "--passes", "1")
    assert tight["model"]["fixed_point"]["passes"] == 0 and one["model"]["fixed_point"]["passes"] == 1
    assert one["model"]["solvers"] == {"simultaneous": "1_passes", "sequential": "1_passes"}
    assert one["metrics"]["perplexity@8"] != tight["metrics"]["perplexity@8"]
    [row] = one["rows"]
    # Every answer counted, as one of exactly one pass, with its last pass's residual.
    assert row["fp_passes_mean"] == 1.0 and row["fp_in_passes"] == row["fp_fixed_points"] > 0
    assert row["fp_last_residual_max"] >= row["fp_last_residual_mean"] > 1e-4
    assert tight["rows"][0]["fp_passes_mean"] > 1


def test_a_fixed_budget_is_reported_as_k_passes_and_a_residual_never_as_not_converged(declaring, shards, tmp_path,
                                                                                       capsys):
    """As shipped, a checkpoint that declares 2 passes: the table names the budget, the
    checkpoint's default, and gives each row's last residual (before: "not converged 100.00%");
    the record keeps the budget and no share of misses of a tolerance nobody asked for."""
    table: list[str] = []
    record = lm_eval(capsys, declaring, shards, tmp_path / "shipped", table=table)
    [row] = record["rows"]
    assert record["budget"] == {"passes": 2, "given": False} and row["fp_passes_mean"] == 2.0
    assert "fp_not_converged_share" not in row and "fp_stopped_at_budget" not in row and row["fp_non_finite"] == 0
    assert table[1] == "budget: 2 passes per solve, no tolerance (the checkpoint's default)"
    assert table[2].split() == ["length", "loss", "perplexity", "tokens", "passes", "retries", "last", "residual"]
    assert table[3].split()[-3:] == ["2.0", "-", f"{row['fp_last_residual_mean']:.2e}"] and "%" not in table[3]
    given = lm_eval(capsys, declaring, shards, tmp_path / "given", "--passes", "3", table=table)
    assert given["budget"] == {"passes": 3, "given": True} and table[-4].endswith("(as given)")


def test_passes_0_or_a_tolerance_flag_given_solve_a_declaring_checkpoint_to_its_tolerance(declaring, shards, tmp_path,
                                                                                          capsys):
    table: list[str] = []
    for flags in (["--passes", "0"], ["--tol", "1e-4"], ["--max-iter", "100"], ["--solver", "fixed_point_iter"],
                  ["--fail-on-nonconvergence"], ["--retry-depth", "1"]):
        record = lm_eval(capsys, declaring, shards, tmp_path / flags[0].strip("-"), *flags, table=table)
        assert record["model"]["fixed_point"]["passes"] == 0, flags
        assert record["rows"][0]["fp_not_converged_share"] == 0.0 and record["budget"]["given"], flags
        assert table[-4] == f"budget: to tolerance {record['budget']['tol']:g} within 100 passes per solve (as given)"
        assert table[-3].split()[-2:] == ["not", "converged"] and table[-2].endswith("0.00%"), table


@pytest.mark.parametrize("flags", [["--max-iter", "5"], ["--tol", "1e-3"], ["--solver", "safeguarded_anderson"],
                                   ["--fail-on-nonconvergence"], ["--retry-depth", "0"]])
def test_a_flag_of_a_solve_to_the_tolerance_beside_k_passes_is_refused_in_one_line(flags, checkpoint, shards,
                                                                                    tmp_path, capsys):
    """``--passes 2 --max-iter 5`` ran 2 passes and recorded max_iter 5; ``--fail-on-nonconvergence``
    under ``--passes`` stopped nothing and recorded "error": each now refused before anything is
    read, in every command that takes both (and beside a sweep of passes)."""
    data = ["--data", str(shards), "--lengths", "8", "--no-progress"]
    commands = [["lm", "eval", str(checkpoint), *data, "--passes", "2"],
                ["eval", "length", "--task", "lm", str(checkpoint), *data, "--passes", "2"],
                ["words", "eval", str(checkpoint), "--lengths", "8", "--passes", "2"],
                ["catbabi", "eval", str(checkpoint), "--data", str(shards), "--passes", "2"],
                ["generate", str(checkpoint), "--prompt", "x", "--passes", "2"],
                ["eval", "budget", "--task", "lm", str(checkpoint), *data, "--passes", "1,2"]]
    flag = flags[0]
    for argv in commands:
        capsys.readouterr()
        assert main([*argv, *flags, "--out", str(tmp_path / "out")]) == 2, argv
        captured = capsys.readouterr()
        [line] = captured.err.strip().splitlines()
        assert line.startswith("implicitlm: error: --passes ") and f"holds no tolerance to solve to, retry or miss: {flag} "\
            in line and "for a solve to the tolerance (--passes 0); give one or the other" in line, line
        assert captured.out == "" and not (tmp_path / "out").exists()


def test_passes_on_an_explicit_model_are_refused_in_one_line(shards, tmp_path, capsys):
    folder = tmp_path / "explicit"
    options = dict(architecture="mamba2", vocab_size=TokenShards(shards, "train").vocab_size, hidden_size=16,
                   num_hidden_layers=1, state_size=8, head_dim=8, chunk_size=8, implicit=False)
    build_model(config_from_options(options)).save_pretrained(folder)
    argv = ["lm", "eval", str(folder), "--data", str(shards), "--lengths", "8", "--no-progress"]
    assert main([*argv, "--passes", "2", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == ("implicitlm: error: --passes 2: an explicit model makes one pass of its stack, "
                                    "there is nothing to iterate")
    assert captured.out == "" and not (tmp_path / "out" / "lm_length.json").exists()
    assert main(argv) == 0 and "budget: one pass of the stack (an explicit model)" in capsys.readouterr().out


def test_records_and_tables_name_what_a_solve_spends_passes_only(checkpoint, shards, tmp_path, capsys):
    """lm eval, eval budget and eval convergence: every key, label and printed line says
    "passes" (before: fp_iterations_mean, "iters used", iterations_mean, an "iterations" axis)."""
    data = ["--data", str(shards), "--lengths", "8", "--max-tokens", "64", "--no-progress"]
    commands = {"lm_length": ["lm", "eval", str(checkpoint), *data],
                "lm_budget": ["eval", "budget", "--task", "lm", str(checkpoint), *data, "--max-iter", "1,3"],
                "convergence": ["eval", "convergence", "--task", "lm", str(checkpoint), *data, "--max-iter", "5"]}
    records, tables = {}, {}
    for experiment, argv in commands.items():
        assert main([*argv, "--out", str(tmp_path / experiment)]) == 0
        tables[experiment] = capsys.readouterr().out.splitlines()
        records[experiment] = json.loads((tmp_path / experiment / f"{experiment}.json").read_text())
    assert former_cost_names(records) == [] and former_cost_names(tables) == []
    assert records["lm_length"]["rows"][0]["fp_passes_mean"] > 1
    assert "passes L8 it3" in records["lm_budget"]["metrics"] and any("passes used" in line for line in tables["lm_budget"])
    assert records["convergence"]["summary"]["all"]["passes_mean"] > 1
    assert records["convergence"]["axes"]["x"] == "passes to reach the tolerance"
