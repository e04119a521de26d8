"""The LM demo end to end on a tiny preset: held-out perplexity of both models, the figure,
and a record per run that a report overlays."""

from __future__ import annotations

import json

import pytest

from implicitlm.cli import main
from tests.train.test_lm_train import SEQUENCE

pytestmark = pytest.mark.slow


def test_lm_demo_reports_held_out_perplexity_of_both_models(tmp_path, capsys):
    preset = {
        "corpus": {"max_bytes": 150_000, "vocab_size": 300, "test_fraction": 0.1},
        "model": {"hidden_size": 16, "num_hidden_layers": 1, "state_size": 8, "head_dim": 8, "chunk_size": 16,
                  "fixed_point": {"max_iter": 8}},
        "train": {"sequence_length": SEQUENCE, "batch_size": 4, "batch_tokens": 4 * SEQUENCE, "total_steps": 4,
                  "warmup_steps": 1, "bounded_fraction": 0.5, "free_max_iter": 6, "free_phantom_steps": 2,
                  "eval_every": 2, "eval_batches": 2, "checkpoint_every": 4},
    }
    (tmp_path / "preset.json").write_text(json.dumps(preset))
    code = main(["lm", "demo", "--preset", str(tmp_path / "preset.json"), "--out", str(tmp_path / "out"), "--no-progress"])
    assert code == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    for kind in ("explicit", "implicit"):
        entry = results["models"][kind]
        assert 1 < entry["test_perplexity"] < 300 * 1.5 and entry["train_tokens"] == 4 * 4 * SEQUENCE
    assert results["corpus"]["test_tokens"] > 0 and (tmp_path / "out" / "perplexity.png").stat().st_size > 1000
    stdout = capsys.readouterr().out
    assert "held-out ppl" in stdout and "s of CPU time (user + system)" in stdout
    assert 0 < results["wall_seconds"] and 0 < results["cpu_seconds"]

    # Each run's held-out curve is a record, which a report overlays for both runs.
    for kind in ("explicit", "implicit"):
        record = json.loads((tmp_path / "out" / kind / "lm_training.json").read_text())
        evaluated = [json.loads(line) for line in (tmp_path / "out" / kind / "metrics.jsonl").read_text().splitlines()]
        ppl = [line["test_ppl"] for line in evaluated if "test_ppl" in line]
        assert record["curves"][0]["x"] == [2 * 4 * SEQUENCE, 4 * 4 * SEQUENCE] and record["curves"][0]["y"] == ppl
        assert record["metrics"] == {"test_ppl": ppl[-1], "train_tokens": 4 * 4 * SEQUENCE}
        assert record["checkpoint"].endswith("step_0000004") and record["model"]["implicit"] == (kind == "implicit")
    assert main(["report", str(tmp_path / "out" / "explicit"), str(tmp_path / "out" / "implicit"),
                 "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "lm_training.png").stat().st_size > 1000
