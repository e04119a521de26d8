"""What the atomic writes leave behind: files and folders with the modes the umask gives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from implicitlm.core.atomic_io import atomic_write, staged_directory
from implicitlm.deq.solvers.anderson import MEMORY
from implicitlm.models.learned_solver import InitialGuess, LearnedMixing
from tests.support.models import tiny_model


@pytest.fixture(params=[0o022, 0o077], ids=["umask 022", "umask 077"])
def umask(request):
    former = os.umask(request.param)
    yield request.param
    os.umask(former)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_saved_checkpoint_follows_the_umask(umask, tmp_path):
    """before: model.safetensors, initial_guess.safetensors and learned_mixing.safetensors
    were -rw------- under umask 022, every other file -rw-r--r--."""
    model = tiny_model(**{
        "architecture": "mamba2", "hidden_size": 16, "num_hidden_layers": 1, "state_size": 8, "head_dim": 8,
        "chunk_size": 8, "vocab_size": 40, "implicit": True})
    model.attach_learned_guess(InitialGuess(16))
    model.attach_learned_mixing(LearnedMixing(MEMORY))
    with staged_directory(tmp_path / "checkpoint") as staging:  # as checkpoints and imports are written
        model.save_pretrained(staging)
    model.save_pretrained(tmp_path / "saved")  # as a user saves a model
    for folder in (tmp_path / "checkpoint", tmp_path / "saved"):
        files = {path.name: mode(path) for path in folder.iterdir()}
        assert {"model.safetensors", "initial_guess.safetensors", "learned_mixing.safetensors"} <= set(files)
        assert files == dict.fromkeys(files, 0o666 & ~umask)
    assert mode(tmp_path / "checkpoint") == 0o777 & ~umask


def test_a_file_written_whole_follows_the_umask(umask, tmp_path):
    atomic_write(tmp_path / "record.json", lambda temporary: temporary.write_text("{}"))
    assert mode(tmp_path / "record.json") == 0o666 & ~umask
