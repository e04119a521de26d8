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


def lm_eval(capsys, checkpoint, shards, out, *flags: str) -> dict:
    """The record of ``lm eval`` with ``flags``."""
    argv = ["lm", "eval", str(checkpoint), "--data", str(shards), "--lengths", "8", "--max-tokens", "64",
            "--no-progress", "--out", str(out), *flags]
    assert main(argv) == 0
    capsys.readouterr()
    return json.loads((out / "lm_length.json").read_text())


def test_passes_change_the_scores_and_are_recorded(checkpoint, shards, tmp_path, capsys):
    tight = lm_eval(capsys, checkpoint, shards, tmp_path / "tight")
    one = lm_eval(capsys, checkpoint, shards, tmp_path / "one", "--passes", "1")
    assert tight["model"]["fixed_point"]["passes"] == 0 and one["model"]["fixed_point"]["passes"] == 1
    assert one["model"]["solvers"] == {"simultaneous": "1_passes", "sequential": "1_passes"}
    assert one["metrics"]["perplexity@8"] != tight["metrics"]["perplexity@8"]
    [row] = one["rows"]
    # Every answer counted, and counted as not yet a fixed point: one pass is far from it.
    assert row["fp_passes_mean"] == 1.0 and row["fp_not_converged_share"] == 1.0
    assert tight["rows"][0]["fp_passes_mean"] > 1


def test_passes_0_or_a_tolerance_given_solve_a_declaring_checkpoint_to_its_tolerance(checkpoint, shards, tmp_path,
                                                                                      capsys):
    declaring = tmp_path / "declaring"
    model = load_model(checkpoint)
    model.set_fixed_point_options(passes=2)
    model.save_pretrained(declaring)
    as_shipped = lm_eval(capsys, declaring, shards, tmp_path / "shipped")
    assert as_shipped["model"]["fixed_point"]["passes"] == 2 and as_shipped["rows"][0]["fp_passes_mean"] == 2.0
    for flags in (["--passes", "0"], ["--tol", "1e-4"], ["--max-iter", "100"]):
        record = lm_eval(capsys, declaring, shards, tmp_path / flags[0].strip("-"), *flags)
        assert record["model"]["fixed_point"]["passes"] == 0, flags
        assert record["rows"][0]["fp_not_converged_share"] == 0.0, flags
    record = lm_eval(capsys, declaring, shards, tmp_path / "both", "--tol", "1e-4", "--passes", "3")
    assert record["rows"][0]["fp_passes_mean"] == 3.0


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
