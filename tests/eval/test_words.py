"""Word-problem accuracy bookkeeping, checked with models whose answers are known."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from implicitlm.data.words import generate_words, prefix_products
from implicitlm.models.output import ImplicitLMOutput
from implicitlm.tasks.word_scoring import word_accuracy
from implicitlm.tasks.words import WordBatches, accuracy_by_length

from tests.support.stubs import ExplicitStub


class AnswerModel(ExplicitStub, nn.Module):
    """Answers with a fixed rule: the true running product up to position ``correct_until``,
    a wrong element after it."""

    config = SimpleNamespace(implicit=False)

    def __init__(self, group: str, correct_until: int) -> None:
        super().__init__()
        self.group, self.correct_until = group, correct_until
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the model a device

    def forward(self, input_ids, mode="simultaneous", max_iter=None, tol=None, fixed_point=None):
        truth = torch.from_numpy(prefix_products(self.group, input_ids.numpy()).astype(np.int64))
        answer = truth.clone()
        answer[:, self.correct_until :] = (truth[:, self.correct_until :] + 1) % 6
        return ImplicitLMOutput(logits=nn.functional.one_hot(answer, 6).float())



def test_accuracy_counts_the_last_ten_and_all_tokens_but_the_first():
    inputs, targets = generate_words("S3", 20, 10, seed=1)
    result = word_accuracy(AnswerModel("S3", correct_until=5), inputs, targets, batch_size=3)
    assert result["accuracy"] == pytest.approx(4 / 19)  # tokens 2 to 5 of 2 to 20
    assert result["accuracy_last10"] == 0.0
    assert result["length"] == 20 and result["sequences"] == 10
    late = word_accuracy(AnswerModel("S3", correct_until=15), inputs, targets)
    assert late["accuracy_last10"] == 5 / 10 and late["accuracy"] == pytest.approx(14 / 19)
    assert list(late)[2] == "accuracy_last10"  # the authors' metric leads the row


def test_copying_the_first_token_scores_nothing():
    # Token 1's label is its own input: a model that copies it and misses every later
    # token would otherwise score 1 / length.
    inputs, targets = generate_words("S3", 10, 20, seed=2)
    assert (targets[:, 0] == inputs[:, 0]).all()
    result = word_accuracy(AnswerModel("S3", correct_until=1), inputs, targets)
    assert result["accuracy"] == 0.0 and result["accuracy_last10"] == 0.0
    with pytest.raises(ValueError, match="at least 2 tokens"):
        word_accuracy(AnswerModel("S3", correct_until=1), inputs[:, :1], targets[:, :1])


def test_a_perfect_model_scores_one_at_every_length():
    rows = accuracy_by_length(AnswerModel("S3", correct_until=10**6), "S3", [4, 8, 16], count=5)
    assert [r["length"] for r in rows] == [4, 8, 16]
    assert all(r["accuracy"] == 1.0 and r["accuracy_last10"] == 1.0 for r in rows)


def test_test_words_differ_from_training_words():
    train_inputs, _ = next(WordBatches("S3", sequence_length=8, batch_size=64))
    seen = {tuple(row) for row in train_inputs.tolist()}
    captured = []

    class Recorder(AnswerModel):
        def forward(self, input_ids, **kwargs):
            captured.extend(tuple(row) for row in input_ids.tolist())
            return super().forward(input_ids, **kwargs)

    accuracy_by_length(Recorder("S3", 0), "S3", [8], count=64)
    assert not seen & set(captured)
