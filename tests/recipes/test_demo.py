"""The state-tracking demo end to end on a tiny preset: table, results, figure and records."""

from __future__ import annotations

import json
import re

import pytest

from implicitlm.cli import main

pytestmark = pytest.mark.slow


def test_demo_trains_both_models_and_reports_by_length(tmp_path, capsys):
    preset = {
        "model": {"hidden_size": 16, "num_hidden_layers": 1, "state_size": 4, "head_dim": 8, "chunk_size": 8,
                  "fixed_point": {"max_iter": 6}},
        "train": {"group": "S3", "sequence_length": 6, "batch_size": 8, "log_every": 1},
        "implicit_train": {"total_steps": 2, "bounded_fraction": 1.0, "bounded_max_iter": 2},
        "explicit_train": {"total_steps": 2},
        "eval": {"length_multiples": [1, 2], "count": 8, "sequential_count": 2},
    }
    (tmp_path / "preset.json").write_text(json.dumps(preset))
    out = tmp_path / "out"
    assert main(["demo", "--preset", str(tmp_path / "preset.json"), "--out", str(out), "--no-progress"]) == 0
    stdout = capsys.readouterr().out
    assert "implicit (RNN mode)" in stdout and "explicit" in stdout
    results = json.loads((out / "results.json").read_text())
    for kind in ("implicit", "explicit"):
        rows = results["models"][kind]["by_length"]
        assert [r["length"] for r in rows] == [6, 12]
        record = json.loads((out / kind / "word_length.json").read_text())
        assert record["model"]["implicit"] == (kind == "implicit") and record["rows"] == rows
    implicit = results["models"]["implicit"]
    assert [r["sequences"] for r in implicit["sequential_by_length"]] == [2, 2]
    # The duality check on the RNN-mode words, and the convergence behind every figure.
    assert [(r["length"], r["sequences"]) for r in implicit["mode_agreement"]] == [(6, 2), (12, 2)]
    assert all(0.0 <= r["argmax_agreement"] <= 1.0 for r in implicit["mode_agreement"])
    for row in implicit["by_length"] + implicit["sequential_by_length"]:
        assert 0.0 <= row["fp_not_converged_share"] <= 1.0 and row["fp_fixed_points"] > 0
    assert "fixed points above the tolerance:" in stdout
    # What the run took, wall and CPU time, for the reader to set beside the documented figures.
    assert 0 < results["wall_seconds"] and 0 < results["cpu_seconds"]
    assert re.search(r"^took \d+ s, \d+ s of CPU time \(user \+ system\)$", stdout, flags=re.MULTILINE), stdout
    assert (out / "accuracy_by_length.png").stat().st_size > 0
    assert main(["report", str(out / "implicit"), str(out / "explicit"), "--out", str(tmp_path / "report")]) == 0
    assert "accuracy@12" in (tmp_path / "report" / "report.md").read_text()
