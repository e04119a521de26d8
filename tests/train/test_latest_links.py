"""A run folder loads with transformers' own ``from_pretrained``: the links the trainer keeps
to its latest checkpoint (``RUN/latest``, ``RUN/config.json``), followed as the run goes on,
with every check ``load_model`` makes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import implicitlm.models  # noqa: F401  (registers the Auto classes)
from implicitlm.cli import main
from implicitlm.core.errors import DataError
from implicitlm.core.run_folder import LATEST, link_latest_checkpoint
from implicitlm.core.targets import TargetExistsError
from implicitlm.data.tokenizer import load_tokenizer, train_tokenizer
from implicitlm.models import ImplicitCausalLM, build_model, config_from_options, load_model
from implicitlm.models.errors import ModelLoadError
from implicitlm.train.checkpoint import save_checkpoint

from tests.support.lm_run import train_tiny_lm
from tests.support.refusals import printed_error_line

PROBE = torch.arange(3, 40).remainder(300)[None]


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(PROBE).logits


@pytest.mark.slow
def test_from_pretrained_on_a_run_folder_loads_its_latest_checkpoint_and_follows_it(shards, tmp_path):
    run = train_tiny_lm(shards, tmp_path / "run", total_steps=2)
    assert os.readlink(run / LATEST) == "checkpoints/step_0000002"
    assert os.readlink(run / "config.json") == "latest/config.json"
    reference = load_model(run)
    assert Path(reference.name_or_path).name == "step_0000002"
    for path in (run, run / LATEST):
        for loader in (AutoModelForCausalLM, ImplicitCausalLM):
            model = loader.from_pretrained(path)
            assert Path(model.name_or_path) == Path(reference.name_or_path).resolve(), (loader, path)
            assert torch.equal(logits(model), logits(reference)), (loader, path)
    assert AutoConfig.from_pretrained(run).model_type == reference.config.model_type
    # The run folder is also the tokenizer's folder: the latest checkpoint's copy of the shards'.
    assert os.readlink(run / "tokenizer.json") == "latest/tokenizer.json"
    text = "def load(path):\n    return path"
    assert AutoTokenizer.from_pretrained(run)(text).input_ids == AutoTokenizer.from_pretrained(run / LATEST)(text).input_ids

    train_tiny_lm(shards, run, total_steps=4, resume=True)  # steps 3 and 4; only step 4 is kept
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000004"]
    assert os.readlink(run / LATEST) == "checkpoints/step_0000004"
    newest = AutoModelForCausalLM.from_pretrained(run)
    assert Path(newest.name_or_path).name == "step_0000004"
    assert torch.equal(logits(newest), logits(load_model(run)))
    assert not torch.equal(logits(newest), logits(reference))  # trained further
    moved = tmp_path / "moved"
    run.rename(moved)  # the links are relative
    assert torch.equal(logits(AutoModelForCausalLM.from_pretrained(moved / LATEST)), logits(newest))
    # A copy that followed the links holds a folder and a file in their place: the run's own.
    copy = Path(shutil.copytree(moved, tmp_path / "copy"))
    assert (copy / LATEST).is_dir() and not (copy / LATEST).is_symlink()
    train_tiny_lm(shards, copy, total_steps=5, resume=True)
    assert os.readlink(copy / LATEST) == "checkpoints/step_0000005" and (copy / "config.json").is_symlink()
    assert (copy / "tokenizer.json").is_symlink() and (copy / "tokenizer_config.json").is_symlink()


def test_a_run_without_a_tokenizer_links_none(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / "step_0000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    (tmp_path / "run" / "tokenizer.json").symlink_to("latest/tokenizer.json")  # from an earlier checkpoint
    link_latest_checkpoint(tmp_path / "run")
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == ["checkpoints", "config.json", "latest"]


@pytest.mark.slow
def test_the_checks_of_load_model_hold_through_from_pretrained_of_a_run(shards, tmp_path):
    run = train_tiny_lm(shards, tmp_path / "run", total_steps=1)
    weights = run / LATEST / "model.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[-1] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    for path in (run, run / LATEST):
        with pytest.raises(ModelLoadError, match="SHA-256 differs"):
            AutoModelForCausalLM.from_pretrained(path)


@pytest.mark.slow
def test_a_file_of_the_users_where_a_run_keeps_its_links_is_refused_before_training(shards, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}')
    command = ["train", "--data", str(shards), "--out", str(out), "--no-progress", "--model", "hidden_size=16",
               "--model", "num_hidden_layers=1", "--model", "state_size=8", "--model", "head_dim=8",
               "--train", "total_steps=1", "--train", "sequence_length=16", "--train", "batch_size=2", "--train", "batch_tokens=32"]
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json: where a run links its latest checkpoint" in err[0]
    assert (out / "config.json").read_text() == '{"mine": true}' and not (out / "checkpoints").exists()


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_nothing_saved_into_a_run_folder_changes_its_checkpoint_unnoticed(shards, tmp_path, capsys):
    """Before: another model's ``save_pretrained(RUN)`` replaced the checkpoint's config.json through
    ``RUN/config.json``; a smaller tokenizer's ``save_pretrained(RUN)`` replaced its tokenizer.json,
    and ``generate`` printed garbage with exit 0."""
    run = train_tiny_lm(shards, tmp_path / "run", total_steps=1)
    checkpoint = (run / LATEST).resolve()
    before = folder_bytes(checkpoint)
    other = build_model(config_from_options({"hidden_size": 32, "head_dim": 8, "num_hidden_layers": 1, "vocab_size": 64}))
    for target in (run, run / LATEST):
        with pytest.raises(TargetExistsError, match=f"^{run}: a training run's folder"):
            other.save_pretrained(target)
    assert folder_bytes(checkpoint) == before
    load_model(run)

    # transformers' tokenizer is not ours: it writes through the links; every load refuses what it wrote.
    train_tokenizer(["a smaller vocabulary of other text"] * 4, 270, tmp_path / "smaller")
    AutoTokenizer.from_pretrained(tmp_path / "smaller").save_pretrained(run)
    changed = f"{checkpoint}/tokenizer.json: changed since the model was saved"
    for load in (load_model, AutoModelForCausalLM.from_pretrained, load_tokenizer):
        with pytest.raises((ModelLoadError, DataError), match=f"^{changed}"):
            load(run)
    assert main(["generate", str(run), "--prompt", "def", "--max-new-tokens", "2"]) == 2
    assert changed in printed_error_line(capsys)


def test_save_pretrained_does_not_write_through_a_link_of_a_folder(tmp_path):
    """Before: config.json written into the file the folder's link points at."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").symlink_to(elsewhere)
    model = build_model(config_from_options({"hidden_size": 16, "head_dim": 8, "num_hidden_layers": 1, "vocab_size": 32}))
    with pytest.raises(TargetExistsError, match="model/config.json: a symbolic link, which save_pretrained would write"):
        model.save_pretrained(tmp_path / "model")
    assert elsewhere.read_text() == "{}" and sorted(p.name for p in (tmp_path / "model").iterdir()) == ["config.json"]


TINY_TRAINING = ["--no-progress", "--train", "sequence_length=16", "--train", "batch_size=2", "--train", "batch_tokens=32"]
# A resume takes the run's own model: the model options go to the fresh run only.
TINY_RUN = ["--model", "hidden_size=16", "--model", "num_hidden_layers=1", "--model", "state_size=8",
            "--model", "head_dim=8", *TINY_TRAINING]


@pytest.mark.slow
@pytest.mark.parametrize("name", [LATEST, "tokenizer.json"])
def test_resume_refuses_to_remove_an_entry_of_the_users_where_the_run_links(name, shards, tmp_path, capsys):
    """Before: ``train --resume`` deleted a real folder ``RUN/latest/`` (the user's notes in it)
    and replaced a ``RUN/tokenizer.json`` of the user's own, exit 0."""
    run = tmp_path / "run"
    assert main(["train", "--data", str(shards), "--out", str(run), "--train", "total_steps=1", *TINY_RUN]) == 0
    (run / name).unlink()
    if name == LATEST:
        (run / name).mkdir()
        (run / name / "notes.txt").write_text("mine")
    else:
        (run / name).write_text('{"mine": true}')
    before = folder_bytes(run)
    command = ["train", "--data", str(shards), "--out", str(run), "--resume", "--train", "total_steps=2", *TINY_TRAINING]
    assert main(command) == 2
    assert f"{run / name}: where a run links its latest checkpoint, and not a copy of" in printed_error_line(capsys)
    assert folder_bytes(run) == before and not (run / name).is_symlink()


@pytest.mark.slow
def test_a_run_whose_latest_links_to_another_runs_checkpoint_is_refused(shards, tmp_path):
    """Before: ``load_model(RUN)`` loaded RUN's own newest checkpoint while transformers' Auto
    classes followed ``RUN/latest`` to the other run's: another run's tokenizer beside RUN's model."""
    run, other = (train_tiny_lm(shards, tmp_path / name, total_steps=1) for name in ("run", "other"))
    (run / LATEST).unlink()
    (run / LATEST).symlink_to(Path("..", "other", "checkpoints", "step_0000001"))
    for path in (run, run / LATEST):
        for load in (load_model, AutoModelForCausalLM.from_pretrained, load_tokenizer):
            with pytest.raises(DataError, match=f"^{run / LATEST}: links to .*other.*, outside the run's own checkpoints"):
                load(path)
    load_model(other)


def test_save_pretrained_into_a_runs_checkpoint_is_refused(tmp_path):
    """Before: another model's ``save_pretrained(RUN/checkpoints/step_N)`` (or through a link to
    it) replaced the checkpoint's weights, config and digests, all consistent: the run loaded and
    resumed another model; one saved as ``step_N+1`` became the run's newest checkpoint."""
    tiny = {"hidden_size": 16, "head_dim": 8, "num_hidden_layers": 1, "vocab_size": 32}
    run = tmp_path / "run"
    checkpoint = save_checkpoint(run / "checkpoints" / "step_0000001", build_model(config_from_options(tiny)),
                                 meta={"step": 1})
    (tmp_path / "alias").symlink_to(checkpoint)
    before = folder_bytes(run)
    other = build_model(config_from_options({**tiny, "hidden_size": 32}))
    for target in (checkpoint, tmp_path / "alias", run / "checkpoints" / "step_0000002"):
        with pytest.raises(TargetExistsError, match=f"^{target}: a training run's checkpoint"):
            other.save_pretrained(target)
    with pytest.raises(TargetExistsError, match=f"^{run}/checkpoints: a training run's checkpoints"):
        other.save_pretrained(run / "checkpoints")
    assert folder_bytes(run) == before and sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000001"]
    assert load_model(run).config.hidden_size == 16
