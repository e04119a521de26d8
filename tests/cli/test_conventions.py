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


def test_a_closed_pipe_ends_the_output_quietly():
    environment = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    # A reader that takes one line and closes the pipe, as `| head -1` does.
    pipeline = subprocess.run(
        ["bash", "-c", f"'{sys.executable}' -m implicitlm models list | head -1; echo \"${{PIPESTATUS[0]}}\""],
        capture_output=True, text=True, env=environment, timeout=120,
    )
    out = pipeline.stdout.splitlines()
    assert out[0].startswith("name") and out[-1] == "141", pipeline
    assert pipeline.stderr == "", pipeline.stderr
