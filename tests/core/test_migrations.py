"""Every old form this package once saved (``core/migrations.py``), written by hand as the old
code wrote it, read through today's reader into today's values: one test per old form."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from implicitlm.cli import main
from implicitlm.core.errors import DataError, OptionError
from implicitlm.core.run_folder import latest_checkpoint, training_settings
from implicitlm.data.shards import TokenShards
from implicitlm.models import build_model, config_from_options, load_model
from implicitlm.presets.run_presets import checkpoint_preset
from implicitlm.tasks.words import WordBatches
from implicitlm.train.config import TrainConfig
from implicitlm.train.checkpoint import CheckpointError, restore_weights, save_checkpoint
from implicitlm.train.trainer import TRAINING_STATE_KEYS, _check_same_data, resume_config

# What the former word trainer's config recorded (its dataclass's fields, in order).
FORMER_WORD_SETTINGS = {
    "group": "S5", "train_length": 8, "batch_size": 32, "hard_prob": None, "lr": 0.003, "min_lr": 1e-05,
    "weight_decay": 0.0, "warmup_steps": 50, "decay_fraction": 0.0, "grad_clip": 1.0, "seed": 3, "unroll_steps": 10,
    "unroll_depth": 16, "bounded_steps": 200, "bounded_iters": 4, "bounded_phantom_steps": 1, "free_steps": 3000,
    "free_iters": 24, "free_phantom_steps": 4, "free_tol": 0.05, "log_every": 25, "checkpoint_every": 0,
    "precision": "auto", "compile": False,
}
# What the former LM trainer's config recorded.
FORMER_LM_SETTINGS = {
    "sequence_length": 64, "batch_tokens": 512, "micro_batch_size": 4, "total_steps": 9, "lr": 0.003,
    "min_lr": 1e-05, "betas": [0.9, 0.95], "weight_decay": 0.1, "warmup_steps": 1, "decay_fraction": 0.1,
    "grad_clip": 1.0, "bounded_fraction": 0.9, "bounded_iters": 4, "bounded_phantom_steps": 1, "free_iters": 24,
    "free_phantom_steps": 4, "free_tol": 0.05, "precision": "auto", "distributed": "ddp",
    "activation_checkpointing": False, "compile": False, "seed": 0, "log_every": 10, "eval_every": 0,
    "eval_batches": 8, "checkpoint_every": 100, "keep_checkpoints": 2,
}


def write_meta(checkpoint: Path, meta: dict) -> Path:
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer.json").write_text(json.dumps(meta))
    return checkpoint


def test_the_former_word_trainers_one_checkpoint_and_settings_resume_as_trained(tmp_path):
    """The former word trainer kept ``RUN/checkpoint`` and spelt ``train_length``,
    ``bounded_steps`` and ``free_steps``; the options it lacked resume at its values."""
    write_meta(tmp_path / "checkpoint", {"step": 20, "train": FORMER_WORD_SETTINGS, "data": None})
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint"
    assert training_settings(tmp_path)["task"] == "words"
    config = resume_config(tmp_path, {})
    assert (config.task, config.group, config.sequence_length, config.total_steps) == ("words", "S5", 8, 3210)
    assert config.bounded_fraction == 200 / 3200
    assert config.curriculum(implicit=True).boundaries() == [(0, "unroll"), (10, "bounded"), (210, "free")]
    assert (tuple(config.betas), config.batch_tokens, config.keep_checkpoints) == ((0.9, 0.999), 0, 1)


def test_the_former_lm_trainers_settings_resume_as_trained(tmp_path):
    """The former LM trainer spelt ``micro_batch_size`` and had no unroll warm-up."""
    write_meta(tmp_path / "checkpoints" / "step_0000009", {"step": 9, "train": FORMER_LM_SETTINGS, "data": None})
    assert training_settings(tmp_path)["batch_size"] == 4
    config = resume_config(tmp_path, {"total_steps": 12})
    assert (config.task, config.batch_size, config.sequence_length, config.total_steps) == ("lm", 4, 64, 12)
    assert (config.unroll_steps, config.group, config.hard_prob, config.accumulation_steps(1)) == (0, "S3", None, 2)


def test_the_former_word_trainers_training_state_resumes_at_its_steps_batch(tmp_path):
    """Its training state held no batch position: the batches followed from the step."""
    torch.manual_seed(0)
    options = dict(vocab_size=6, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8)
    model = build_model(config_from_options(options))
    state = {"optimizer": {"state": {}, "param_groups": []}, "scheduler": {}, "torch_rng": torch.get_rng_state()}
    save_checkpoint(tmp_path / "checkpoint", model, training_state=state,
                    meta={"step": 7, "train": FORMER_WORD_SETTINGS, "data": None})
    step, restored = restore_weights(model, latest_checkpoint(tmp_path), TRAINING_STATE_KEYS)
    assert (step, restored["sampler"]) == (7, {"micro_batches": 7})
    # A checkpoint of today's layout without the position is damaged, not old: nothing is made up.
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoints" / "step_0000007")
    assert "sampler" not in restore_weights(model, latest_checkpoint(tmp_path), TRAINING_STATE_KEYS)[1]


def test_a_checkpoints_words_described_before_their_digest_compare_without_it(tmp_path):
    """Checkpoints written before the training words' digest describe them without
    ``inputs_sha256``: the same words resume, other words are refused."""
    words = {"group": "S3", "count": 64, "length": 6}
    checkpoint = write_meta(tmp_path / "checkpoint", {"step": 2, "train": FORMER_WORD_SETTINGS, "data": words})
    today = SimpleNamespace(description=lambda: {**words, "inputs_sha256": "ab" * 32}, data_named=WordBatches.data_named)
    _check_same_data(checkpoint, today)
    other = SimpleNamespace(description=lambda: {**words, "count": 32, "inputs_sha256": "ab" * 32},
                            data_named=WordBatches.data_named, DATA_FORM=WordBatches.DATA_FORM)
    with pytest.raises(CheckpointError, match="the run trained on a word file"):
        _check_same_data(checkpoint, other)


def test_a_shard_index_of_format_1_reads_as_format_2_without_a_digest(tmp_path):
    """Format 1 was written before shards recorded their tokenizer's digest."""
    tokens = np.array([5, 6, 7, 1, 8, 9, 1], dtype="<u2")
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "shard_00000.bin").write_bytes(tokens.tobytes())
    shard = {"file": "test/shard_00000.bin", "tokens": 7, "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()}
    index = {"format_version": 1, "dtype": "uint16", "vocab_size": 10, "eos_token_id": 1, "tokenizer": "gpt2",
             "splits": {"test": {"shards": [shard], "tokens": 7, "documents": 2}}}
    (tmp_path / "index.json").write_text(json.dumps(index))
    shards = TokenShards(tmp_path, "test", verify=True)
    assert shards.tokenizer_sha256 is None and shards.tokenizer == "gpt2"
    assert shards.read(0, 7).tolist() == tokens.tolist()


def test_a_preset_that_spells_a_former_trainers_option_is_refused_with_todays_name(tmp_path, capsys):
    """Presets written for the former word trainer spelt ``train_length``."""
    (tmp_path / "p.json").write_text(json.dumps({"model": {"hidden_size": 16}, "train": {"train_length": 8}}))
    code = main(["words", "train", "--out", str(tmp_path / "run"), "--preset", str(tmp_path / "p.json"), "--no-progress"])
    assert code == 2
    assert capsys.readouterr().err.strip() == "implicitlm: error: training option 'train_length' is now sequence_length"
    assert not (tmp_path / "run").exists()


def test_a_config_saved_under_torchdeqs_option_names_loads_with_todays(tmp_path):
    """Configs saved before the one vocabulary spelt the fixed-point options as torchdeq does
    (``eval_f_max_iter``, ``f_solver`` ...): they load with today's names and values, through
    ``load_model`` and through transformers alike."""
    from transformers import AutoModelForCausalLM

    from implicitlm.models import load_model

    model = build_model(config_from_options({"hidden_size": 16, "head_dim": 8, "num_hidden_layers": 1, "vocab_size": 32}))
    model.save_pretrained(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    today = dict(config["fixed_point"])
    former = {"f_solver": "anderson", "f_max_iter": 5, "f_tol": 0.02, "f_stop_mode": "abs", "eval_f_max_iter": 48,
              "eval_f_tol": 0.004, "eval_f_solver": "broyden", "sequential_f_solver": "safeguarded_anderson",
              "eval_chunk_length": 12, "eval_nonconvergence": "error"}
    for old, new in {"f_solver": "solver", "f_max_iter": "train_max_iter", "f_tol": "train_tol",
                     "f_stop_mode": "stop_mode", "eval_f_max_iter": "max_iter", "eval_f_tol": "tol",
                     "eval_f_solver": "simultaneous_solver", "sequential_f_solver": "sequential_solver",
                     "eval_chunk_length": "chunk_length", "eval_nonconvergence": "nonconvergence"}.items():
        del today[new]
        today[old] = former[old]
    config["fixed_point"] = today
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    (tmp_path / "model" / "files.sha256").unlink()  # saved before the config's digest was recorded
    expected = {"solver": "anderson", "train_max_iter": 5, "train_tol": 0.02, "stop_mode": "abs", "max_iter": 48,
                "tol": 0.004, "simultaneous_solver": "broyden", "sequential_solver": "safeguarded_anderson",
                "chunk_length": 12, "nonconvergence": "error"}
    for loaded in (load_model(tmp_path / "model"), AutoModelForCausalLM.from_pretrained(tmp_path / "model")):
        assert {name: loaded.config.fixed_point[name] for name in expected} == expected
        assert loaded.solver.options.max_iter == 48


def test_a_config_naming_an_option_under_both_names_is_refused():
    with pytest.raises(OptionError, match="'eval_f_max_iter' is the former name of 'max_iter'"):
        config_from_options({"hidden_size": 16, "head_dim": 8, "fixed_point": {"eval_f_max_iter": 8, "max_iter": 9}})


def test_a_model_size_file_spelling_free_iterations_gives_the_presets_of_todays_free_passes(tmp_path, monkeypatch):
    """Size files written before the one vocabulary named the free variant's training budget
    ``free_iterations``; one dropped among the presets reads as today's ``free_passes``."""
    from implicitlm.presets import model_presets

    model = {"architecture": "mamba", "vocab_size": 64, "num_hidden_layers": 1, "hidden_size": 16}
    (tmp_path / "models").mkdir()
    for stem, budget in (("old-tiny", "free_iterations"), ("new-tiny", "free_passes"), ("both-tiny", None)):
        keys = {"free_iterations": 20, "free_passes": 20} if budget is None else {budget: 20}
        size = {"model": model, **keys, "parameters": {"explicit": 1, "implicit": 2}}
        (tmp_path / "models" / f"{stem}.json").write_text(json.dumps(size))
    monkeypatch.setattr(model_presets, "resources", SimpleNamespace(files=lambda package: tmp_path))
    model_presets._size_files.cache_clear()
    try:
        with pytest.raises(OptionError, match="^model size file key given twice: 'free_iterations' is the former name "
                                              "of 'free_passes'$"):
            model_presets.model_preset("old-tiny-free")
        (tmp_path / "models" / "both-tiny.json").unlink()
        model_presets._size_files.cache_clear()
        for variant in model_presets.VARIANTS:
            assert model_presets.model_preset(f"old-tiny-{variant}") == model_presets.model_preset(f"new-tiny-{variant}")
        fixed_point = model_presets.model_preset("old-tiny-free")["fixed_point"]
        assert (fixed_point["train_max_iter"], fixed_point["max_iter"], fixed_point["phantom_steps"]) == (20, 80, 4)
    finally:
        model_presets._size_files.cache_clear()


def test_phase_budgets_saved_as_iters_resume_as_max_iter_and_are_refused_in_a_preset(tmp_path, capsys):
    """Runs saved before the one vocabulary recorded ``bounded_iters`` / ``free_iters``."""
    settings = {**FORMER_LM_SETTINGS, "task": "lm", "batch_size": 4, "unroll_steps": 0, "unroll_depth": 16,
                "group": "S3", "hard_prob": None, "bounded_iters": 3, "free_iters": 17}
    del settings["micro_batch_size"]
    write_meta(tmp_path / "run" / "checkpoints" / "step_0000009", {"step": 9, "train": settings, "data": None})
    config = resume_config(tmp_path / "run", {"total_steps": 12})
    assert (config.bounded_max_iter, config.free_max_iter) == (3, 17)
    (tmp_path / "p.json").write_text(json.dumps({"model": {"hidden_size": 16}, "train": {"free_iters": 8}}))
    code = main(["words", "train", "--out", str(tmp_path / "new"), "--preset", str(tmp_path / "p.json"), "--no-progress"])
    assert code == 2
    assert capsys.readouterr().err.strip() == "implicitlm: error: training option 'free_iters' is now free_max_iter"


@pytest.mark.parametrize("change, expected", [
    # before: TypeError: unsupported operand type(s) for +: 'int' and 'str'
    (dict(bounded_steps="1"), "training option 'bounded_steps' must be an integer >= 0, got '1'"),
    (dict(free_steps=None), "training option 'free_steps' must be an integer >= 0, got None"),
    # before: train_length won over sequence_length without a word
    (dict(sequence_length=16), "training option given twice: 'train_length' is the former name of 'sequence_length'"),
], ids=["bounded-steps-text", "free-steps-null", "both-lengths"])
def test_a_former_word_run_of_a_wrong_type_or_a_setting_given_twice_is_one_line(tmp_path, capsys, change, expected):
    write_meta(tmp_path / "checkpoint", {"step": 20, "train": {**FORMER_WORD_SETTINGS, **change}, "data": None})
    meta = (tmp_path / "checkpoint" / "trainer.json").read_bytes()
    for read in (lambda: training_settings(tmp_path), lambda: resume_config(tmp_path, {})):
        with pytest.raises(DataError) as refused:
            read()
        assert str(refused.value) == f"{tmp_path / 'checkpoint' / 'trainer.json'}: {expected}"
    code = main(["words", "train", "--out", str(tmp_path), "--resume", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"implicitlm: error: {tmp_path / 'checkpoint' / 'trainer.json'}: {expected}"], err
    assert (tmp_path / "checkpoint" / "trainer.json").read_bytes() == meta


@pytest.mark.parametrize("settings, key, hint", [
    ({**FORMER_LM_SETTINGS, "lrr": 0.01}, "lrr", "did you mean 'lr'?"),
    ({**FORMER_WORD_SETTINGS, "free_tols": 0.1}, "free_tols", "did you mean 'free_tol'?"),
], ids=["lm", "words"])
def test_a_resume_refuses_an_unknown_training_setting_naming_it(tmp_path, settings, key, hint):
    """Before: dropped, and the run resumed with that setting at its default."""
    checkpoint = write_meta(tmp_path / "checkpoints" / "step_0000009", {"step": 9, "train": settings, "data": None})
    with pytest.raises(DataError) as refused:
        resume_config(tmp_path, {"total_steps": 12})
    message = str(refused.value)
    assert message.startswith(str(checkpoint / "trainer.json")) and f"unknown key '{key}'" in message and hint in message


@pytest.mark.parametrize("change, key", [({"lrr": 0.01}, "lrr"), ({"train_length": 8}, "train_length")],
                         ids=["misspelt", "former-beside-today"])
def test_every_reader_of_a_checkpoints_training_settings_refuses_an_unknown_one_naming_it(tmp_path, capsys, change, key):
    """Before: only a resume refused it; loading, evaluating, generating from the checkpoint
    and a run preset made of it dropped the key in silence."""
    model = build_model(config_from_options(dict(vocab_size=6, hidden_size=16, num_hidden_layers=1, state_size=8,
                                                 head_dim=8)))
    settings = dataclasses.asdict(TrainConfig.for_task("lm"))
    save_checkpoint(tmp_path, model, meta={"step": 9, "train": settings, "data": None})
    (tmp_path / "trainer.json").write_text(json.dumps({"step": 9, "train": {**settings, **change}, "data": None}))
    meta = (tmp_path / "trainer.json").read_bytes()
    for read in (lambda: load_model(tmp_path), lambda: training_settings(tmp_path), lambda: checkpoint_preset(tmp_path)):
        with pytest.raises(DataError) as refused:
            read()
        assert str(refused.value).startswith(f"{tmp_path / 'trainer.json'}: unknown key '{key}'"), refused.value
    code = main(["generate", str(tmp_path), "--prompt", "a"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{tmp_path / 'trainer.json'}: unknown key '{key}'" in err[0], err
    assert (tmp_path / "trainer.json").read_bytes() == meta
