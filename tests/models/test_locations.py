"""A model's name that is neither a folder here nor a Hub id (``owner/name``) is refused at once,
in one line naming it, by every way a model is loaded: ``load_model``, ``from_pretrained``, the
commands that take a checkpoint and the lm-eval adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from implicitlm.cli import main
from implicitlm.core.errors import OptionError
from implicitlm.eval.lm_eval_command import run_command
from implicitlm.models import ImplicitCausalLM, ImplicitMamba2ForCausalLM, ModelLoadError, load_model

from tests.models.test_import_and_load import OPTIONS
from tests.support.models import tiny_model
from tests.support.refusals import one_error_line

pytestmark = pytest.mark.usefixtures("offline_hub")


def one_line(call, error_type: type = ModelLoadError) -> str:
    with pytest.raises(error_type) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and "config_class" not in message, message
    return message


@pytest.mark.parametrize("loader", [load_model, ImplicitCausalLM.from_pretrained, ImplicitMamba2ForCausalLM.from_pretrained])
@pytest.mark.parametrize("name", ["nonexist", "./nonexist", "nonexist/", "../nonexist/model", "a/b/c"])
def test_a_missing_path_is_named_as_missing(loader, name, tmp_path, monkeypatch):
    """Before: ImplicitCausalLM does not define `config_class` (a ValueError of transformers')."""
    monkeypatch.chdir(tmp_path)
    message = one_line(lambda: loader(name))
    assert message.startswith(name) and "does not exist" in message
    assert "does not exist" in one_line(lambda: loader(tmp_path / name))


def test_an_empty_or_no_path_is_refused_in_one_line():
    """Before: ValueError: PosixPath('.') has an empty name; TypeError for None."""
    assert "empty path" in one_line(lambda: load_model(""))
    for value in (None, 3, b"model"):
        assert "pretrained_model_name_or_path" in one_line(lambda: load_model(value), OptionError)


def test_a_hub_id_found_nowhere_is_one_line_naming_it():
    """Offline, an owner/name goes to the Hub, and what the Hub says is one line naming it."""
    for loader in (load_model, ImplicitMamba2ForCausalLM.from_pretrained):
        message = one_line(lambda: loader("someone/no-such-model"))
        assert message.startswith("someone/no-such-model: ") and "Hub" in message


@pytest.mark.parametrize("folder, cwd, name", [("owner/name", ".", "owner/name"), ("model", "model", ".")],
                         ids=["a-hub-like-name", "dot"])
def test_a_model_folder_here_loads_by_its_relative_name(folder, cwd, name, tmp_path, monkeypatch):
    tiny_model(0, **OPTIONS).save_pretrained(tmp_path / folder)
    monkeypatch.chdir(tmp_path / cwd)
    assert isinstance(load_model(name), ImplicitMamba2ForCausalLM)


@pytest.mark.parametrize("argv", [
    ["generate", "nonexist", "--prompt", "a"],
    ["lm", "eval", "nonexist", "--data", "."],
    ["solver", "train", "nonexist", "--out", "fit"],
    ["words", "eval", "nonexist"],
])
def test_commands_name_a_missing_checkpoint(argv, tmp_path, monkeypatch, capsys):
    line = refusal_writing_nothing(argv, tmp_path, monkeypatch, capsys)
    assert line.startswith("implicitlm: error: nonexist") and "does not exist" in line, line


def refusal_writing_nothing(argv: list[str], folder: Path, monkeypatch, capsys) -> str:
    """The one error line of the command ``argv`` run in ``folder``, which it must leave empty."""
    monkeypatch.chdir(folder)
    line = one_error_line(main(argv), capsys.readouterr().err)
    assert sorted(path.name for path in Path(folder).iterdir()) == []
    return line


def test_the_lm_eval_command_names_a_missing_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = run_command(["--model", "implicitlm", "--model_args", "pretrained=nonexist", "--tasks", "piqa_local",
                        "--limit", "1", "--device", "cpu"])
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert code == 2 and len(err) == 1 and err[0].startswith("implicitlm-lm-eval: error: nonexist: does not exist"), err


@pytest.mark.parametrize("name", [".", "..", "/", "empty/.."])
def test_the_current_folder_or_the_root_without_a_model_is_named(name, tmp_path, monkeypatch):
    """Before: ValueError: PosixPath('.') has an empty name (and for "/")."""
    (tmp_path / "cwd" / "empty").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    assert one_line(lambda: load_model(name)).startswith(f"{name}: not a model directory")


@pytest.mark.parametrize("argv", [
    ["generate", ".", "--prompt", "a"],
    ["lm", "eval", ".", "--data", "."],
    ["solver", "train", ".", "--out", "fit"],
    ["words", "eval", "."],
    ["jacobian", ".", "--out", "fit"],
])
def test_commands_name_the_current_folder_holding_no_model(argv, tmp_path, monkeypatch, capsys):
    """Before: "PosixPath('.') has an empty name"; from jacobian an UnboundLocalError traceback."""
    line = refusal_writing_nothing(argv, tmp_path, monkeypatch, capsys)
    # A checkpoint's folder is checked before torch loads, saying what it holds.
    assert line == "implicitlm: error: .: an empty folder, not a model directory (no config.json)", line
