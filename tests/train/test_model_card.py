"""Every checkpoint carries a model card: what the model is, what it was trained on, how to
load it and how it solves; the weights and their digest are untouched by it."""

from __future__ import annotations

import pytest
import torch

from implicitlm.models import build_model, config_from_options, load_model
from implicitlm.train.checkpoint import save_checkpoint
from tests.support.models import tiny_model


@pytest.mark.slow
def test_a_checkpoint_has_a_model_card_and_still_loads(tmp_path):
    model = tiny_model(0, vocab_size=300, hidden_size=16, num_hidden_layers=2, state_size=8, head_dim=8,
                       fixed_point={"max_iter": 40, "tol": 0.02})
    meta = {"step": 30, "processes": 1, "train": {"task": "lm", "sequence_length": 64, "batch_size": 4, "batch_tokens": 512}}
    path = save_checkpoint(tmp_path / "step_0000030", model, meta=meta)
    card = (path / "README.md").read_text()
    assert card.startswith(f"# implicit_mamba2: {model.num_parameters() / 1e6:.1f}M parameters, implicit\n")
    assert "2 blocks of width 16, 300 tokens" in card and f"parameters: {model.num_parameters():,}" in card
    assert "trained: 30 steps, 15,360 tokens (lm task, sequence length 64)" in card
    assert "load_model(\"CHECKPOINT\")" in card and "AutoModelForCausalLM.from_pretrained(\"CHECKPOINT\")" in card
    assert "- max_iter: 40" in card and "- tol: 0.02" in card
    loaded = load_model(path)  # the weights' digest is checked as it loads
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


def test_an_explicit_models_card_has_no_fixed_point_settings(tmp_path):
    model = build_model(config_from_options(dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8, implicit=False)))
    card = (save_checkpoint(tmp_path / "step_0000001", model, meta={"step": 1}) / "README.md").read_text()
    assert ", explicit\n" in card.splitlines(keepends=True)[0] and "Fixed-point" not in card


def test_a_card_says_the_few_pass_stage(tmp_path):
    model = build_model(config_from_options(dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8)))
    train = {"task": "lm", "sequence_length": 64, "batch_tokens": 512, "few_pass_steps": 60, "few_pass_passes": 2,
             "few_pass_fixed_point": 1.0, "few_pass_distance": 0.0, "few_pass_jacobian": 0.0}
    card = (save_checkpoint(tmp_path / "step_0000060", model, meta={"step": 60, "train": train}) / "README.md").read_text()
    assert "- few-pass stage: the last 60 steps trained the output after 2 passes from z = 0" in card
    plain = (save_checkpoint(tmp_path / "plain", model, meta={"step": 1, "train": {**train, "few_pass_steps": 0}})
             / "README.md").read_text()
    assert "few-pass" not in plain


def test_a_words_card_says_its_group_and_the_contraction_stage(tmp_path):
    model = build_model(config_from_options(dict(vocab_size=120, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8, label_alignment="aligned")))
    train = {"task": "words", "group": "S5", "sequence_length": 8, "batch_size": 64, "contraction_steps": 800,
             "contraction_jacobian": 0.1}
    card = (save_checkpoint(tmp_path / "stage", model, meta={"step": 4000, "train": train}) / "README.md").read_text()
    assert "(words task, group S5, sequence length 8)" in card
    assert "- contraction stage: 800 steps of the free phase's solves under a Jacobian penalty of weight 0.1" in card
    plain = (save_checkpoint(tmp_path / "plain", model, meta={"step": 1, "train": {**train, "contraction_steps": 0}})
             / "README.md").read_text()
    assert "contraction" not in plain


def test_a_card_says_where_a_run_began_and_what_was_measured_since(tmp_path):
    """A shipped checkpoint's trainer.json may carry what was measured of it ("measured"), which
    its card shows; before, such a key was refused on read and a warm start's source unsaid."""
    from implicitlm.core.run_folder import read_trainer_meta
    from implicitlm.train.model_card import model_card

    model = build_model(config_from_options(dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8)))
    meta = {"step": 4, "train": {"task": "lm", "sequence_length": 64, "batch_tokens": 512},
            "initialised_from": "checkpoints/source", "measured": ["perplexity 41.2 on held-out text"]}
    folder = save_checkpoint(tmp_path / "step_0000004", model, meta=meta)
    card = (folder / "README.md").read_text()
    assert "- initialised from: checkpoints/source\n" in card
    assert "## Measured\n\n- perplexity 41.2 on held-out text\n" in card
    assert model_card(model, read_trainer_meta(folder)) == card
