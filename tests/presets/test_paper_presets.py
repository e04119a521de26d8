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


@pytest.mark.slow
@pytest.mark.parametrize("name", LM_PRESETS)
def test_parameter_counts_match_the_paper(name):
    size, _, variant = name.rpartition("-")
    implicit, explicit = PAPER_PARAMETERS[size]
    expected = explicit if variant == "explicit" else implicit
    assert count_parameters(name) / 1e6 == pytest.approx(expected, rel=0.01)


def test_counting_on_the_meta_device_counts_the_real_model():
    model = build_model(config_from_options(model_preset("mamba2-words-a5-free")))
    assert count_parameters("mamba2-words-a5-free") == sum(p.numel() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", model_preset_names())
def test_the_parameter_counts_a_size_file_records_are_its_models(name):
    from implicitlm.presets import preset_summary

    assert preset_summary(name)["parameters"] == count_parameters(name)


def test_models_list_builds_no_model_and_imports_no_torch():
    import subprocess
    import sys

    listing = "import sys; from implicitlm.cli import main; code = main(['models', 'list']); print(code, 'torch' in sys.modules)"
    ran = subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True, timeout=120)
    assert ran.stdout.strip().splitlines()[-1] == "0 False", ran.stderr[-2000:]
    assert "mamba2-130m-bounded" in ran.stdout and "131.7" in ran.stdout


def test_variants_carry_the_authors_budgets():
    bounded = config_from_options(model_preset("mamba2-130m-bounded")).fixed_point_options
    assert (bounded.train_max_iter, bounded.phantom_steps, bounded.tau, bounded.max_iter) == (4, 1, 0.8, 16)
    for name, passes in [("mamba2-370m-free", 24), ("llama-370m-free", 32)]:
        free = config_from_options(model_preset(name)).fixed_point_options
        assert (free.train_max_iter, free.phantom_steps, free.train_tol, free.stop_mode) == (passes, 4, 0.05, "rel")
        assert free.max_iter == 4 * passes
    words = config_from_options(model_preset("mamba2-words-a5-free")).fixed_point_options
    assert (words.train_max_iter, words.max_iter) == (32, 2048)


def test_a_size_file_of_any_family_gives_its_free_variant_its_own_passes(monkeypatch):
    """Before: the free budget came from a table keyed by mamba2 and llama only, so a size file of
    another family (Mamba1 here) failed with a KeyError."""
    from implicitlm.presets import model_presets

    mamba = {"model": {"architecture": "mamba", "vocab_size": 64, "num_hidden_layers": 1, "hidden_size": 16},
             "free_passes": 20, "parameters": {"explicit": 1, "implicit": 2}}
    monkeypatch.setattr(model_presets, "_size_files", lambda: {"mamba-tiny": mamba})
    free = config_from_options(model_preset("mamba-tiny-free")).fixed_point_options
    assert (free.train_max_iter, free.phantom_steps, free.max_iter, free.train_tol) == (20, 4, 80, 0.05)
    assert model_presets.preset_summary("mamba-tiny-free")["variant"] == "free (20+4)"


def test_the_state_tracking_model():
    config = config_from_options(model_preset("mamba2-words-a5-free"))
    shape = (config.num_hidden_layers, config.hidden_size, config.expand, config.head_dim, config.state_size)
    assert shape == (1, 256, 4, 64, 128)
    assert config.vocab_size == 60 and config.label_alignment == "aligned"
    options = config.fixed_point_options
    assert (options.train_max_iter, options.phantom_steps, options.max_iter) == (32, 4, 2048)


def test_presets_are_fresh_copies():
    model_preset("llama-130m-free")["fixed_point"]["train_max_iter"] = 1
    assert model_preset("llama-130m-free")["fixed_point"]["train_max_iter"] == 32


def test_unknown_preset_names_close_matches():
    with pytest.raises(ValueError, match="unknown model preset 'mamba2-130m-fre'.*mamba2-130m-free"):
        model_preset("mamba2-130m-fre")
    with pytest.raises(ValueError, match="unknown model preset 'mamba2-words-a5-bounded'"):
        model_preset("mamba2-words-a5-bounded")  # a size file that lists its variants has only those


@pytest.mark.slow
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
    with pytest.raises(SystemExit) as refused:  # by the parser, before torch is imported
        main(["models", "show", "llama-760m"])
    assert refused.value.code == 2
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
    # in simultaneous mode, where a solve needs about the window's length in passes.
    assert preset["model"]["num_hidden_layers"] == 1
    assert preset["model"]["fixed_point"]["max_iter"] > preset["train"]["sequence_length"]


# ---------------------------------------------------------------- registered and checkpoint presets


def test_a_registered_preset_loads_by_name_as_a_copy_and_cannot_replace_a_shipped_one(capsys):
    from implicitlm.presets import preset_names, register_preset
    from implicitlm.presets.run_presets import _REGISTERED

    mine = {"model": {"hidden_size": 16, "state_size": 8, "head_dim": 8}, "train": {"group": "Z3", "total_steps": 1}}
    try:
        register_preset("tiny_z3", mine)
        mine["train"]["total_steps"] = 99  # later changes do not reach the registered copy
        assert "tiny_z3" in preset_names() and load_preset("tiny_z3")["train"]["total_steps"] == 1
        assert main(["words", "train", "--preset", "tiny_z3", "--out", "/dev/null/never", "--no-progress",
                     "--train", "log_every=1", "--train", "lr=nan"]) == 2  # the preset's options go through the checks
        with pytest.raises(ValueError, match="'demo' is a shipped preset"):
            register_preset("demo", mine)
        with pytest.raises(ValueError, match="preset section"):
            register_preset("broken", {"train": [1]})
    finally:
        _REGISTERED.clear()
    assert "tiny_z3" not in preset_names()


@pytest.mark.slow
def test_a_checkpoint_is_a_preset_of_its_own_model_and_training(tmp_path):
    from implicitlm.models import load_model
    from implicitlm.presets import model_options_from

    first = ["words", "train", "--out", str(tmp_path / "first"), "--no-progress", "--model", "hidden_size=16",
             "--model", "state_size=8", "--model", "head_dim=8", "--model", "expand=1", "--train", "group=Z3",
             "--train", "sequence_length=5", "--train", "batch_size=4", "--train", "total_steps=2"]
    assert main(first) == 0
    preset = load_preset(str(tmp_path / "first"))
    assert preset["model"]["architecture"] == "mamba2" and preset["model"]["expand"] == 1
    assert preset["train"]["group"] == "Z3" and preset["train"]["total_steps"] == 2 and "task" not in preset["train"]
    assert model_options_from(str(tmp_path / "first")) == preset["model"]
    again = ["words", "train", "--preset", str(tmp_path / "first"), "--out", str(tmp_path / "again"), "--no-progress"]
    assert main(again) == 0
    first_config, again_config = (load_model(tmp_path / run).config.to_dict() for run in ("first", "again"))
    assert {k: v for k, v in again_config.items() if k != "_name_or_path"} == {
        k: v for k, v in first_config.items() if k != "_name_or_path"}
    with pytest.raises(ValueError, match="not a model directory|unknown preset"):
        load_preset(str(tmp_path / "missing"))


def test_a_misspelt_preset_section_is_refused_not_ignored(tmp_path, capsys):
    """The hostile probe: a preset whose sections are misspelt trained the default 24-layer model."""
    preset = tmp_path / "p.json"
    preset.write_text('{"modle": {"hidden_size": 8}, "trian": {"batch_size": 2}}')
    assert main(["words", "train", "--preset", str(preset), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"implicitlm: error: {preset}: unknown preset section 'modle' (did you mean 'model'?)"]
    assert not (tmp_path / "run").exists()
    assert main(["train", "--data", str(tmp_path), "--config", str(preset), "--out", str(tmp_path / "lm")]) == 2
    assert "unknown preset section 'modle'" in capsys.readouterr().err
