"""The library's errors name its Python arguments; the command line shows them as its flags."""

from __future__ import annotations

import pytest

from implicitlm.cli import build_parser, main
from implicitlm.cli.arguments import as_flags, command_flags
from implicitlm.core.targets import refuse_existing
from implicitlm.train.run_log import refuse_earlier_run


def checkpointed_run(folder):
    """A run folder's log and a checkpoint (empty: only the refusal reads it)."""
    (folder / "metrics.jsonl").write_text("")
    (folder / "checkpoints" / "step_0000001").mkdir(parents=True)


def test_a_run_folder_refused_from_python_names_the_arguments(tmp_path):
    checkpointed_run(tmp_path)
    with pytest.raises(FileExistsError) as refused:
        refuse_earlier_run(tmp_path, overwrite=False)
    assert str(refused.value).endswith("continue it with resume=True or replace it with overwrite=True")
    assert "--" not in str(refused.value)


def test_a_target_refused_from_python_names_the_argument(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match=r"exists; replace it with overwrite=True$"):
        refuse_existing(tmp_path / "file")


def test_the_command_line_shows_the_same_refusal_in_its_flags(tmp_path, capsys):
    checkpointed_run(tmp_path)
    assert main(["words", "train", "--out", str(tmp_path), "--preset", "words_s5"]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("continue it with --resume or replace it with --overwrite"), err


def test_arguments_become_the_commands_own_flags_with_their_values():
    flags = command_flags(build_parser(), build_parser().parse_args(["train", "--data", "d", "--out", "o"]).run)
    assert flags["preset"] == "--config" and flags["init_from"] == "--init-from"
    message = "resume=True goes on; init_from starts anew; preset='lm_demo' fits; errors='replace' reads; only train_options"
    assert as_flags(message, ("resume", "init_from", "preset", "errors", "train_options"), flags) == (
        "--resume goes on; --init-from starts anew; --config lm_demo fits; --errors replace reads; only --train"
    )
    # A word that is not one of the error's arguments, or only part of a longer name, stays.
    assert as_flags("the preset's model_preset", ("preset",), flags) == "the preset's model_preset"
    # So does a folder of a path that has its name (before: /home/me/--data/run).
    assert as_flags("/home/me/data/run/data: resume with data=FOLDER", ("data",), flags) == (
        "/home/me/data/run/data: resume with --data FOLDER"
    )
