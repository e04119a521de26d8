"""Every checkpoint carries a model card: what the model is, what it was trained on, how to
load it and how it solves; the weights and their digest are untouched by it."""

from __future__ import annotations

import json

import pytest
import torch

from implicitlm.core.errors import DataError
from implicitlm.core.run_folder import read_trainer_meta
from implicitlm.models import build_model, config_from_options, load_model
from implicitlm.train.checkpoint import save_checkpoint, warm_start
from implicitlm.train.model_card import model_card
from tests.support.models import tiny_model


@pytest.mark.slow
def test_a_checkpoint_has_a_model_card_and_still_loads(tmp_path):
    model = tiny_model(0, vocab_size=300, hidden_size=16, num_hidden_layers=2, state_size=8, head_dim=8,
                       fixed_point={"max_iter": 40, "tol": 0.02})
    meta = {"step": 30, "processes": 1, "train": {"task": "lm", "sequence_length": 64, "batch_size": 4, "batch_tokens": 512}}
    path = save_checkpoint(tmp_path / "step_0000030", model, meta=meta)
    card = (path / "README.md").read_text()
    # Before: "# implicit_mamba2: 0.0M parameters", "2 blocks" but "1 blocks" for one.
    assert card.startswith(f"# mamba2, implicit: 10.8k parameters\n") and model.num_parameters() == 10_848
    assert "- architecture: mamba2, 2 blocks of width 16, a vocabulary of 300 tokens\n" in card
    assert "- parameters: 10,848\n" in card
    assert "1. implicit, from scratch: 30 steps, 15,360 tokens (lm task, sequence length 64); this checkpoint\n" in card
    assert "load_model(\"CHECKPOINT\")" in card and "AutoModelForCausalLM.from_pretrained(\"CHECKPOINT\")" in card
    assert "fixed_point_iter from z = 0 to a residual below 0.02 (rel), at most 40 passes" in card
    loaded = load_model(path)  # the weights' digest is checked as it loads
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


def test_an_explicit_models_card_has_no_fixed_point_settings(tmp_path):
    model = build_model(config_from_options(dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8, implicit=False)))
    card = (save_checkpoint(tmp_path / "step_0000001", model, meta={"step": 1}) / "README.md").read_text()
    # Before: "family: implicit_mamba2 (1 blocks ...)" beside "kind: explicit".
    assert card.startswith("# mamba2, explicit: ") and "How it solves" not in card
    assert "- architecture: mamba2, 1 block of width 16" in card and "- kind: explicit: one pass of its stack\n" in card
    assert "1. explicit, from scratch: 1 steps (training settings not recorded); this checkpoint\n" in card


def test_a_card_says_the_few_pass_stage(tmp_path):
    model = build_model(config_from_options(dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8)))
    train = {"task": "lm", "sequence_length": 64, "batch_tokens": 512, "few_pass_steps": 60, "few_pass_passes": 2,
             "few_pass_fixed_point": 1.0, "few_pass_distance": 0.0, "few_pass_jacobian": 0.0}
    card = (save_checkpoint(tmp_path / "step_0000060", model, meta={"step": 60, "train": train}) / "README.md").read_text()
    assert "   - few-pass stage: the last 60 steps trained the output after 2 passes from z = 0" in card
    plain = (save_checkpoint(tmp_path / "plain", model, meta={"step": 1, "train": {**train, "few_pass_steps": 0}})
             / "README.md").read_text()
    assert "few-pass" not in plain


def test_a_words_card_says_its_group_and_the_contraction_stage(tmp_path):
    model = build_model(config_from_options(dict(vocab_size=120, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8, label_alignment="aligned")))
    train = {"task": "words", "group": "S5", "sequence_length": 8, "batch_size": 64, "total_steps": 4000,
             "contraction_steps": 800, "contraction_jacobian": 0.1}
    card = (save_checkpoint(tmp_path / "stage", model, meta={"step": 4000, "train": train}) / "README.md").read_text()
    assert "(words task, group S5, sequence length 8)" in card
    assert "   - contraction stage: 800 steps of the free phase's solves under a Jacobian penalty of weight 0.1" in card
    plain = (save_checkpoint(tmp_path / "plain", model, meta={"step": 1, "train": {**train, "contraction_steps": 0}})
             / "README.md").read_text()
    assert "contraction" not in plain


def test_a_card_says_where_a_run_began_and_what_was_measured_since(tmp_path):
    """A shipped checkpoint's trainer.json may carry what was measured of it ("measured"), which
    its card shows; before, such a key was refused on read and a warm start's source unsaid."""
    model = build_model(config_from_options(dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8)))
    meta = {"step": 4, "train": {"task": "lm", "sequence_length": 64, "batch_tokens": 512},
            "initialised_from": "checkpoints/source", "measured": ["perplexity 41.2 on held-out text"]}
    folder = save_checkpoint(tmp_path / "step_0000004", model, meta=meta)
    card = (folder / "README.md").read_text()
    assert "1. implicit, initialised from checkpoints/source: 4 steps, 2,048 tokens" in card
    assert "## Measured\n\n- perplexity 41.2 on held-out text\n" in card
    assert model_card(model, read_trainer_meta(folder)) == card


def test_a_card_tells_every_stage_of_a_warm_started_models_lineage(tmp_path):
    """An explicit model, turned implicit, then given a second implicit stage: the last card
    lists all three stages with their steps and tokens (before: "trained: 2 steps", the last
    stage's, and its source named as its origin)."""
    options = dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8)
    train = {"task": "lm", "sequence_length": 64, "batch_size": 4, "batch_tokens": 256}
    source = build_model(config_from_options({**options, "implicit": False}))
    folder = save_checkpoint(tmp_path / "explicit", source, meta={"step": 5, "train": train, "processes": 1})
    for number, steps in ((1, 3), (2, 2)):
        model = build_model(config_from_options(options))
        start = warm_start(model, folder)
        folder = save_checkpoint(tmp_path / f"implicit_{number}", model,
                                 meta={"step": steps, "train": train, "processes": 1, **start.history()})
    card = (folder / "README.md").read_text()
    assert "\n## Training\n\n" \
           "1. explicit, from scratch: 5 steps, 1,280 tokens (lm task, sequence length 64)\n" \
           f"2. implicit, from stage 1 ({tmp_path / 'explicit'}): 3 steps, 768 tokens (lm task, sequence length 64)\n" \
           f"3. implicit, from stage 2 ({tmp_path / 'implicit_1'}): 2 steps, 512 tokens (lm task, sequence length 64); " \
           "this checkpoint\n\nIn all: 10 steps, 2,560 tokens.\n" in card
    assert model_card(model, read_trainer_meta(folder)) == card


def test_a_card_says_each_modes_solve_as_the_loaded_model_runs_it(tmp_path):
    """Before: "solver: fixed_point_iter" beside a simultaneous_solver that every scoring solve
    used instead, and a passes budget that replaced both."""
    model = build_model(config_from_options(dict(
        vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8,
        fixed_point={"solver": "fixed_point_iter", "simultaneous_solver": "safeguarded_anderson", "max_iter": 30,
                     "simultaneous_max_iter": 50, "tol": 0.01, "chunk_length": 64})))
    card = model_card(model, {})
    assert "No training recorded" in card and "solver: fixed_point_iter" not in card
    assert "- a sequence at once (simultaneous mode: scoring and evaluation): safeguarded_anderson from z = 0 to a " \
           "residual below 0.01 (rel), at most 50 passes, in chunks of 64 tokens (reports say `safeguarded_anderson`)\n" in card
    assert "- token by token (sequential mode: generation): fixed_point_iter from z = 0 to a residual below 0.01 (rel), " \
           "at most 30 passes (reports say `fixed_point_iter`)\n" in card
    model.set_fixed_point_options(passes=2)
    card = model_card(model, {})
    assert card.count("exactly 2 passes of plain iteration from z = 0, no tolerance") == 2
    assert "safeguarded_anderson" not in card and card.count("(reports say `2_passes`)") == 2


@pytest.mark.parametrize("line, shown", [
    ("## Loading", "- \\## Loading\n"),
    ("1. first", "- 1\\. first\n"),
    ("```python", "- \\```python\n"),
    ("> quoted <script>x</script>", "- \\> quoted &lt;script>x&lt;/script>\n"),
    ("perplexity 41.2 (`lm eval`)", "- perplexity 41.2 (`lm eval`)\n"),
])
def test_a_records_line_is_text_of_its_list_item_never_markdown_of_the_card(tmp_path, line, shown):
    """Before: a measured line "## Loading" was a section of the card, and one holding a line
    break ("...\n## Loading\n```python ...") a fake section with code of its own."""
    model = build_model(config_from_options(dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8, implicit=False)))
    card = model_card(model, {"measured": [line], "initialised_from": line, "step": 1, "train": {"task": "lm"}})
    assert f"## Measured\n\n{shown}" in card and card.count("\n## Loading\n") == 1 and card.count("\n```") == 2


@pytest.mark.parametrize("change, problem", [
    ({"measured": 5}, "checkpoint metadata 'measured' must be a list of strings (each one line of printable text), got 5"),
    ({"measured": ["fine", "x\n## Loading\n```python"]}, "checkpoint metadata 'measured' must be a list of strings"),
    ({"step": "x"}, "checkpoint metadata 'step' must be an integer >= 0, got 'x'"),
    ({"processes": 0}, "checkpoint metadata 'processes' must be an integer >= 1, got 0"),
    ({"initialised_from": "a\rb"}, "checkpoint metadata 'initialised_from' must be a string (one line of printable text)"),
    ({"data": 5}, "checkpoint metadata 'data' must be a dict or null, got 5"),
    ({"lineage": {"step": 1}}, "checkpoint metadata 'lineage' must be a list of dicts"),
    ({"lineage": [{"step": 1, "train": {}}]}, "stage 1 of the lineage has no 'implicit'"),
    ({"lineage": [{"step": 1, "train": {}, "implicit": "yes"}]}, "stage 1 of the lineage 'implicit' must be true or false"),
    ({"lineage": [{"step": 1, "train": {"lrr": 1}, "implicit": True}]}, "unknown key 'lrr'"),
    ({"lineage": [{"step": 1, "train": {}, "implicit": True, "measured": []}]},
     "unknown key 'measured' in stage 1 of the lineage"),
])
def test_every_key_of_a_checkpoints_record_is_checked_as_it_is_read(tmp_path, change, problem):
    model = build_model(config_from_options(dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8)))
    folder = save_checkpoint(tmp_path / "step_0000001", model, meta={"step": 1, "train": {"task": "lm"}})
    (folder / "trainer.json").write_text(json.dumps({"step": 1, "train": {"task": "lm"}, **change}))
    for read in (read_trainer_meta, load_model):
        with pytest.raises(DataError) as refused:
            read(folder)
        assert str(refused.value).startswith(f"{folder / 'trainer.json'}: ") and problem in str(refused.value)
