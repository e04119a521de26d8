"""Word files with derived targets: same words as stored ones, half the bytes, same batches."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from implicitlm.cli import main
from implicitlm.data import words
from implicitlm.core.errors import DataError
from implicitlm.data.word_dataset import WordDataset
from implicitlm.data.word_storage import load_words, save_words, sidecar_path, write_generated_words
from implicitlm.data.words import DerivedTargets, generate_words, verify_targets
from implicitlm.tasks.word_scoring import word_accuracy
from implicitlm.tasks.words import WordBatches
from tests.support.models import tiny_model


def write_pair(tmp_path, group="S5", length=12, count=30, seed=3, hard_prob=None):
    """The same words written with stored and with derived targets."""
    return tuple(
        write_generated_words(tmp_path / f"{kind}.npy", group, length, count, seed, hard_prob, targets=kind)
        for kind in ("stored", "derived")
    )


@pytest.mark.parametrize("group, hard_prob", [("S5", None), ("A5xM", 0.5)])
def test_derived_targets_equal_stored_ones_by_every_index(tmp_path, monkeypatch, group, hard_prob):
    monkeypatch.setattr(words, "BLOCK_TOKENS", 100)  # several generation blocks per file
    stored, derived = write_pair(tmp_path, group, hard_prob=hard_prob)
    expected_inputs, expected_targets = generate_words(group, 12, 30, 3, hard_prob)
    np.testing.assert_array_equal(stored.inputs, expected_inputs)
    np.testing.assert_array_equal(derived.inputs, expected_inputs)
    targets = derived.targets
    assert isinstance(targets, DerivedTargets)
    assert targets.shape == (30, 12) and targets.dtype == np.uint8 and len(targets) == 30
    rows = np.array([0, 4, 5, 17, 29])
    mask = np.arange(30) % 3 == 0
    for key in (0, 7, -1, slice(None), slice(3, 11), slice(2, None, 5), rows, [9, 2], mask, (rows, slice(None, 5)), (6, 4)):
        np.testing.assert_array_equal(targets[key], expected_targets[key], err_msg=repr(key))
    np.testing.assert_array_equal(np.asarray(targets), expected_targets)
    assert np.asarray(targets, dtype=np.int64).dtype == np.int64
    with pytest.raises(ValueError, match="copy"):
        np.asarray(targets, copy=False)
    assert verify_targets(group, derived.inputs, targets)
    assert derived.meta["targets"] == "derived" and derived.group == stored.group


def test_derived_targets_are_read_only(tmp_path):
    _, derived = write_pair(tmp_path)
    with pytest.raises(TypeError):
        derived.targets[0] = 0
    assert not derived.inputs.flags.writeable


def test_derived_file_is_half_the_size(tmp_path):
    write_pair(tmp_path, length=128, count=64)
    stored_bytes = (tmp_path / "stored.npy").stat().st_size
    derived_bytes = (tmp_path / "derived.npy").stat().st_size
    assert stored_bytes > 2 * 64 * 128 and 0.49 < derived_bytes / stored_bytes < 0.51


def test_stored_files_keep_their_metadata_and_old_files_still_load(tmp_path):
    stored, _ = write_pair(tmp_path)
    assert "targets" not in json.loads(sidecar_path(tmp_path / "stored.npy").read_text())
    assert isinstance(stored.targets, np.memmap)
    # A derived file's metadata given to save_words must not mislabel the stored copy.
    _, derived = write_pair(tmp_path / "again")
    save_words(tmp_path / "copy.npy", derived.inputs, derived.targets, derived.meta)
    copy = load_words(tmp_path / "copy.npy")
    assert "targets" not in copy.meta and isinstance(copy.targets, np.memmap)
    np.testing.assert_array_equal(copy.targets, stored.targets)


def test_unknown_target_storage_is_refused(tmp_path):
    write_pair(tmp_path)
    sidecar = sidecar_path(tmp_path / "derived.npy")
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "targets": "lazy"}))
    with pytest.raises(DataError, match="'lazy'"):
        load_words(tmp_path / "derived.npy")
    with pytest.raises(ValueError, match="targets must be one of"):
        write_generated_words(tmp_path / "x.npy", "S5", 4, 4, targets="lazy")
    # The shape check still guards a sidecar that lies about the storage.
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "targets": "stored"}))
    with pytest.raises(DataError, match="shape"):
        load_words(tmp_path / "derived.npy")


def test_trainer_batches_and_dataset_items_match(tmp_path):
    stored, derived = write_pair(tmp_path, count=20)
    length = stored.inputs.shape[1]
    stored_batches = WordBatches(stored.group, length, batch_size=8, seed=5, data=stored)
    derived_batches = WordBatches(derived.group, length, batch_size=8, seed=5, data=derived)
    for _ in range(5):  # past the end of the first epoch
        (x, y), (dx, dy) = next(stored_batches), next(derived_batches)
        assert dy.dtype == torch.int64
        assert torch.equal(x, dx) and torch.equal(y, dy)
    stored_items, derived_items = WordDataset(stored), WordDataset(derived)
    for index in (0, 19):
        assert all(torch.equal(stored_items[index][k], derived_items[index][k]) for k in ("input_ids", "labels"))


def test_evaluation_on_derived_words_equals_stored(tmp_path):
    stored, derived = write_pair(tmp_path, group="S3", length=8, count=10)
    model = tiny_model(
        architecture="mamba2", vocab_size=6, hidden_size=16, num_hidden_layers=1, state_size=4, head_dim=8,
        expand=2, implicit=False, label_alignment="aligned",
    )
    assert word_accuracy(model, derived.inputs, derived.targets, batch_size=4) == word_accuracy(
        model, stored.inputs, stored.targets, batch_size=4
    )


def run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_cli_generates_derived_words_that_train(tmp_path, capsys):
    common = ("words", "generate", "--group", "Z3", "--length", "6", "--count", "16", "--seed", "2")
    assert run(capsys, *common, "--out", str(tmp_path / "stored.npy"))[0] == 0
    code, err = run(capsys, *common, "--targets", "derived", "--out", str(tmp_path / "derived.npy"))
    assert code == 0, err
    stored, derived = load_words(tmp_path / "stored.npy"), load_words(tmp_path / "derived.npy", group="Z3")
    assert derived.meta["targets"] == "derived" and isinstance(derived.targets, DerivedTargets)
    np.testing.assert_array_equal(derived.inputs, stored.inputs)
    np.testing.assert_array_equal(derived.targets[:], stored.targets)
    code, err = run(
        capsys, "words", "train", "--out", str(tmp_path / "run"), "--no-progress", "--data", str(tmp_path / "derived.npy"),
        "--train", "group=Z3", "--train", "sequence_length=6", "--train", "batch_size=8", "--train", "total_steps=2",
        "--model", "hidden_size=16", "--model", "num_hidden_layers=1", "--model", "state_size=4", "--model", "head_dim=8",
    )
    assert code == 0, err
    assert (tmp_path / "run" / "checkpoints" / "step_0000002" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "out, extra, fragment",
    [("words.csv", (), "CSV"), ("words.npy", ("--hard-prob", "0.5"), "direct product")],
)
def test_cli_bad_combinations_are_clean_errors(tmp_path, capsys, out, extra, fragment):
    code, err = run(
        capsys, "words", "generate", "--group", "S5", "--length", "4", "--count", "2",
        "--targets", "derived", "--out", str(tmp_path / out), *extra,
    )
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("implicitlm: error:") and fragment in lines[0], err
    assert not any(tmp_path.iterdir()), "nothing may be left behind"


def test_cli_refuses_an_unknown_storage(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["words", "generate", "--group", "S5", "--length", "4", "--count", "2", "--targets", "lazy",
              "--out", str(tmp_path / "w.npy")])
    assert exit_info.value.code == 2
