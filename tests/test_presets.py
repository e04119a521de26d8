"""The paper's model presets: names, options, parameter counts against the paper's, the CLI table."""

from __future__ import annotations

import json

import pytest

from implicitlm.cli import main
from implicitlm.presets import load_preset
from implicitlm.models import build_model, config_from_options
from implicitlm.presets import count_parameters, model_preset, model_preset_names

# SPEC §2, from the authors' configs: millions of parameters, (implicit, explicit).
PAPER_PARAMETERS = {
    "mamba2-130m": (131.7, 129.0),
    "mamba2-370m": (373.2, 368.3),
    "mamba2-760m": (790.6, 780.2),
    "mamba2-1.3b": (1361.9, 1343.8),
    "llama-130m": (125.4, 123.6),
    "llama-370m": (356.9, 353.5),
    "llama-760m": (764.2, 756.8),
    "llama-1.3b": (1324.1, 1311.0),
}
LM_PRESETS = [f"{size}-{variant}" for size in PAPER_PARAMETERS for variant in ("explicit", "bounded", "free")]


def test_every_language_model_size_has_three_variants_and_the_words_model_two():
    names = model_preset_names()
    assert set(LM_PRESETS) <= set(names) and len(LM_PRESETS) == 24
    assert set(names) - set(LM_PRESETS) == {"mamba2-words-a5-explicit", "mamba2-words-a5-free"}
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("name", model_preset_names())
def test_every_preset_builds_a_config(name):
    config = config_from_options(model_preset(name))
    assert config.implicit == (not name.endswith("-explicit"))
    assert config.padded_vocab_size % 16 == 0


@pytest.mark.parametrize("name", LM_PRESETS)
def test_parameter_counts_match_the_paper(name):
    size, _, variant = name.rpartition("-")
    implicit, explicit = PAPER_PARAMETERS[size]
    expected = explicit if variant == "explicit" else implicit
    assert count_parameters(name) / 1e6 == pytest.approx(expected, rel=0.01)


def test_counting_on_the_meta_device_counts_the_real_model():
    model = build_model(config_from_options(model_preset("mamba2-words-a5-free")))
    assert count_parameters("mamba2-words-a5-free") == sum(p.numel() for p in model.parameters())


def test_variants_carry_the_authors_budgets():
    bounded = config_from_options(model_preset("mamba2-130m-bounded")).fixed_point_options
    assert (bounded.f_max_iter, bounded.phantom_steps, bounded.tau, bounded.eval_f_max_iter) == (4, 1, 0.8, 16)
    for name, iterations in [("mamba2-370m-free", 24), ("llama-370m-free", 32)]:
        free = config_from_options(model_preset(name)).fixed_point_options
        assert (free.f_max_iter, free.phantom_steps, free.f_tol, free.f_stop_mode) == (iterations, 4, 0.05, "rel")
        assert free.eval_f_max_iter == 4 * iterations


def test_the_state_tracking_model():
    config = config_from_options(model_preset("mamba2-words-a5-free"))
    shape = (config.num_hidden_layers, config.hidden_size, config.expand, config.head_dim, config.state_size)
    assert shape == (1, 256, 4, 64, 128)
    assert config.vocab_size == 60 and config.label_alignment == "aligned"
    options = config.fixed_point_options
    assert (options.f_max_iter, options.phantom_steps, options.eval_f_max_iter) == (32, 4, 2048)


def test_presets_are_fresh_copies():
    model_preset("llama-130m-free")["fixed_point"]["f_max_iter"] = 1
    assert model_preset("llama-130m-free")["fixed_point"]["f_max_iter"] == 32


def test_unknown_preset_names_close_matches():
    with pytest.raises(ValueError, match="unknown model preset 'mamba2-130m-fre'.*mamba2-130m-free"):
        model_preset("mamba2-130m-fre")
    with pytest.raises(ValueError, match="unknown model preset 'mamba2-words-a5-bounded'"):
        model_preset("mamba2-words-a5-bounded")  # a size file that lists its variants has only those


def test_models_list_shows_every_preset(capsys):
    assert main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(rows) == model_preset_names()
    assert rows["mamba2-130m-free"][1:] == ["mamba2", "24", "768", "free", "(24+4)", "96", "131.7"]
    assert rows["llama-1.3b-explicit"][-1] == "1311.0"


def test_models_show_and_unknown_name(capsys):
    assert main(["models", "show", "llama-760m-bounded"]) == 0
    assert json.loads(capsys.readouterr().out) == model_preset("llama-760m-bounded")
    assert main(["models", "show", "llama-760m"]) == 2
    assert "unknown model preset 'llama-760m'" in capsys.readouterr().err


def test_a_shipped_preset_name_wins_over_a_file_of_that_name_in_the_working_directory(tmp_path, monkeypatch):
    from implicitlm.presets import load_preset

    monkeypatch.chdir(tmp_path)
    (tmp_path / "words_a5").write_text('{"train": {"group": "S3"}}')
    (tmp_path / "demo").mkdir()
    assert load_preset("words_a5")["train"]["group"] == "A5"
    assert "train" in load_preset("demo")  # the shipped preset, not the folder (which would be an error)
    # Written as a path, the file is meant.
    assert load_preset("./words_a5")["train"]["group"] == "S3"


@pytest.mark.parametrize("vocab_size", [23, 180])  # bAbI task 1 alone; all 20 tasks
def test_catbabi_preset_gives_both_kinds_the_same_size(vocab_size):
    preset = load_preset("catbabi")
    sizes = {}
    for kind, implicit in [("implicit", True), ("explicit", False)]:
        options = {**preset["model"], **preset.get(f"{kind}_model", {}), "implicit": implicit, "vocab_size": vocab_size}
        sizes[kind] = sum(p.numel() for p in build_model(config_from_options(options)).parameters())
    assert sizes["explicit"] == pytest.approx(sizes["implicit"], rel=0.03)
    # One layer, as the paper's catbAbI anchor; the evaluation budget covers a whole window
    # in simultaneous mode, where a solve needs about the window's length in iterations.
    assert preset["model"]["num_hidden_layers"] == 1
    assert preset["model"]["fixed_point"]["eval_f_max_iter"] > preset["train"]["sequence_length"]
