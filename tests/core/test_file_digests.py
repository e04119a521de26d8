"""A model folder's config, generation config and tokenizer are checked at load against the
SHA-256s its save recorded (``files.sha256``); a folder saved before they were recorded loads,
saying what went unchecked."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from implicitlm.cli import main
from implicitlm.core.file_digests import FILES_DIGEST
from implicitlm.data.tokenizer import save_tokenizer, train_tokenizer
from implicitlm.models import build_model, config_from_options, load_model
from implicitlm.models.errors import ModelLoadError

OPTIONS = {"hidden_size": 16, "head_dim": 8, "num_hidden_layers": 1, "vocab_size": 300}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A model saved with its tokenizer beside it, as the trainer and ``models import`` save one."""
    folder = tmp_path_factory.mktemp("saved") / "model"
    save_tokenizer(train_tokenizer(["some text to learn merges from"] * 4, 300, folder.parent / "tok"), folder)
    build_model(config_from_options(OPTIONS)).save_pretrained(folder)
    return folder


def copy_of(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "model"))


def test_the_save_records_the_config_and_the_tokenizer_as_sha256sum_checks_them(saved):
    names = [line.split()[1] for line in (saved / FILES_DIGEST).read_text().splitlines()]
    assert names == ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--check", "--quiet", FILES_DIGEST], cwd=saved, check=True)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_a_config_or_tokenizer_of_another_model_is_refused_at_load(saved, tmp_path, name):
    """Before: another model's config.json, or a smaller tokenizer, loaded without a word."""
    folder = copy_of(saved, tmp_path)
    if name == "config.json":
        build_model(config_from_options({**OPTIONS, "hidden_size": 32})).save_pretrained(tmp_path / "other")
    else:
        save_tokenizer(train_tokenizer(["another text"] * 4, 270, tmp_path / "tok"), tmp_path / "other")
    shutil.copy(tmp_path / "other" / name, folder / name)
    with pytest.raises(ModelLoadError) as refused:
        load_model(folder)
    assert str(refused.value) == (f"{folder / name}: changed since the model was saved (its SHA-256 differs from "
                                  f"{FILES_DIGEST}); restore it, or save the model again to record a change of your own")


def test_a_recorded_file_that_is_gone_or_a_malformed_record_is_refused(saved, tmp_path):
    folder = copy_of(saved, tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=f"^{folder}/tokenizer.json: missing, though {FILES_DIGEST} records it"):
        load_model(folder)
    (folder / FILES_DIGEST).write_text("0" * 64 + "  ../../elsewhere.json\n")
    with pytest.raises(ModelLoadError, match=f"^{folder / FILES_DIGEST}:1: expected a SHA-256 and the name of one of"):
        load_model(folder)


def test_a_folder_saved_before_the_files_were_recorded_loads_saying_so(saved, tmp_path, caplog):
    folder = copy_of(saved, tmp_path)
    (folder / FILES_DIGEST).unlink()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "use_cache": False}))
    with caplog.at_level("WARNING", logger="implicitlm"):
        load_model(folder)
    assert [r.getMessage() for r in caplog.records] == [
        f"{folder}: no {FILES_DIGEST}: its config and tokenizer loaded without checking them for changes"]


def test_an_imported_model_records_the_tokenizer_it_copied(tmp_path):
    """``models import`` saves the source's tokenizer before the model, so its digests cover it."""
    from tests.models.test_convert import mamba2_reference

    mamba2_reference().save_pretrained(tmp_path / "hf")
    save_tokenizer(train_tokenizer(["some text to learn merges from"] * 4, 300, tmp_path / "tok"), tmp_path / "hf")
    assert main(["models", "import", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    recorded = [line.split()[1] for line in (tmp_path / "ours" / FILES_DIGEST).read_text().splitlines()]
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(recorded)
