"""The word-problem models the repository ships (``checkpoints/words``: S5 and A5, trained by
the state-tracking recipe of docs/results/state-tracking.md): each loads with its checksum,
its card says its group and recipe, and on fresh words up to eight times its training length
it answers the last ten tokens as the recipe promises, every word's fixed point under the
tolerance at its own budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from implicitlm.cli import main
from implicitlm.core.run_folder import read_trainer_meta
from implicitlm.models import load_model

SHIPPED = Path(__file__).parents[2] / "checkpoints" / "words"
GROUPS = {"s5": "S5", "a5": "A5"}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_a_shipped_word_model_holds_eight_times_its_length_with_every_word_converged(name, tmp_path):
    """The recipe's goals, on 256 fresh words per length (a seed no training or measurement
    used): last-10 accuracy >= 99% at 4x and >= 95% at 8x, no word above the tolerance."""
    out = tmp_path / "eval"
    command = ["words", "eval", str(SHIPPED / name), "--multiples", "1,2,4,8", "--count", "256", "--seed", "11",
               "--out", str(out), "--no-progress"]
    assert main(command) == 0
    record = json.loads((out / "word_length.json").read_text())
    assert (record["group"], record["train_length"]) == (GROUPS[name], 8)
    accuracy = {row["length"]: row["accuracy_last10"] for row in record["rows"]}
    assert accuracy[8] == 1.0 and accuracy[32] >= 0.99 and accuracy[64] >= 0.95, accuracy
    assert [row["fp_not_converged"] for row in record["rows"]] == [0, 0, 0, 0]
    assert all(row["max_iter"] == 256 and row["tol"] == 1e-4 for row in record["rows"])


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_a_shipped_word_models_card_says_its_group_recipe_and_measurements(name):
    folder = SHIPPED / name
    model = load_model(folder)
    assert model.config.implicit and model.config.vocab_size == {"S5": 120, "A5": 60}[GROUPS[name]]
    assert 190_000 < model.num_parameters() < 210_000
    meta = read_trainer_meta(folder)
    assert meta["train"]["group"] == GROUPS[name] and meta["train"]["contraction_steps"] == 800
    card = (folder / "README.md").read_text()
    assert f"group {GROUPS[name]}, sequence length 8" in card and "- contraction stage: 800 steps" in card
    assert "## Measured" in card and "words_contraction" in card
    # Both stages of the recipe, each 64 words of 8 tokens a step.
    assert f"1. implicit, from scratch: 3,200 steps, 1,638,400 tokens (words task, group {GROUPS[name]}, " \
           "sequence length 8)\n2. implicit, from stage 1 (stage 1: `implicitlm words train --preset words_s5" in card
    assert "In all: 4,000 steps, 2,048,000 tokens." in card
    assert not (folder / "training_state.pt").exists()  # weights ship, never a pickle
