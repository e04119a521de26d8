"""What a new user meets first: every option explained in --help, the version, a closed
pipe, a tokenizer that pads."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import implicitlm
from implicitlm.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def commands(parser: argparse.ArgumentParser, prefix: str = "implicitlm"):
    """Every (sub)command's name and parser, the top one included."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from commands(command, f"{prefix} {name}")


def test_every_option_of_every_command_has_help():
    missing = [
        f"{name} {action.option_strings[-1]}"
        for name, parser in commands(build_parser()) for action in parser._actions
        if action.option_strings and not action.help
    ]
    assert missing == []


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.strip() == f"implicitlm {implicitlm.__version__}"


@pytest.mark.slow
@pytest.mark.parametrize("reader, statuses", [
    ("head -1", {"0", "141"}),  # the output may all be in the pipe before head closes it
    ("true", {"141"}),  # closed before the command, still importing, writes a line
])
def test_a_closed_pipe_ends_the_output_quietly(reader, statuses):
    environment = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    pipeline = subprocess.run(
        ["bash", "-c", f"'{sys.executable}' -m implicitlm models list | {reader}; echo \"${{PIPESTATUS[0]}}\""],
        capture_output=True, text=True, env=environment, timeout=120,
    )
    out = pipeline.stdout.splitlines()
    assert out[-1] in statuses and pipeline.stderr == "", pipeline
    if reader == "head -1":
        assert len(out) == 2 and out[0].startswith("name")


def test_every_command_runs_from_a_source_tree_without_package_metadata(monkeypatch, capsys):
    """The GPU check's machine runs the checkout's src/ uninstalled: no metadata to read the
    version from, and the command line must still parse (it failed there on every command)."""
    import implicitlm.cli as cli

    def not_installed(name):
        raise cli.PackageNotFoundError(name)

    monkeypatch.setattr(cli, "version", not_installed)
    assert main(["models", "list"]) == 0
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0 and "not installed" in capsys.readouterr().out
