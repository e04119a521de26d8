"""Behaviour of a briefly trained demo-size implicit model."""

from __future__ import annotations

import json

import numpy as np
import torch

from implicitlm.data.words import generate_words
from implicitlm.eval.words import word_accuracy
from implicitlm.models import load_model

from conftest import TRAINED_GROUP, TRAINED_LENGTH


def test_training_learns_the_word_problem(trained_s3):
    model, _ = trained_s3
    inputs, targets = generate_words(TRAINED_GROUP, TRAINED_LENGTH, 256, seed=123)
    result = word_accuracy(model, inputs, targets)
    # Chance is 1/6 per token; the schedule reaches well above 90% on this seed.
    assert result["accuracy"] > 0.9


def test_simultaneous_and_sequential_fixed_points_agree_on_trained_model(trained_s3):
    model, _ = trained_s3
    inputs, _ = generate_words(TRAINED_GROUP, TRAINED_LENGTH, 8, seed=7)
    x = torch.from_numpy(inputs.astype(np.int64))
    with torch.no_grad():
        parallel = model(x, mode="simultaneous", max_iter=400, tol=1e-6)
        recurrent = model(x, mode="sequential", max_iter=400, tol=1e-6)
    assert bool(parallel.fixed_point.converged.all())
    assert bool(recurrent.fixed_point.converged.all())
    torch.testing.assert_close(parallel.logits, recurrent.logits, atol=2e-3, rtol=1e-3)
    assert torch.equal(parallel.logits.argmax(-1), recurrent.logits.argmax(-1))


def test_checkpoint_reloads_to_identical_logits(trained_s3):
    model, run = trained_s3
    reloaded = load_model(run / "checkpoint").eval()
    x = torch.from_numpy(generate_words(TRAINED_GROUP, TRAINED_LENGTH, 4, seed=3)[0].astype(np.int64))
    with torch.no_grad():
        assert torch.equal(model(x).logits, reloaded(x).logits)


def test_training_log_records_phases_and_convergence(trained_s3):
    _, run = trained_s3
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    phases = [row["phase"] for row in rows]
    assert phases[0] == "unroll" and phases[-1] == "free"
    assert all("fp_rel_residual_mean" in row and "tokens_per_s" in row for row in rows)
    assert (run / "tensorboard").is_dir()
