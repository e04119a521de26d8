"""The fixed-point flags the evaluation commands share: ``--initial-guess`` offers the options'
own starts, and ``--solver`` starts every solve from z = 0 unless ``--initial-guess`` says
otherwise, as its help says."""

from __future__ import annotations

import argparse

import pytest

from implicitlm.cli import build_parser
from implicitlm.cli.shared import fixed_point_settings
from implicitlm.core import option_names
from implicitlm.deq import options as deq_options

# Commands that take the solver flags (their words, then their required arguments).
COMMANDS = ((["words", "eval"], ["ckpt"]), (["generate"], ["ckpt", "--prompt", "a"]))
PER_MODE_GUESSES = {"simultaneous_initial_guess": "", "sequential_initial_guess": ""}


def help_of(words: list[str], dest: str) -> str:
    """The help text of the option ``dest`` of the command ``words``, on one line."""
    parser = build_parser()
    for word in words:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return " ".join(next(action for action in parser._actions if action.dest == dest).help.split())


@pytest.mark.parametrize("words, required", COMMANDS)
def test_initial_guess_offers_the_options_starts(words, required, monkeypatch):
    """Before: the parser hard-coded ("zero", "learned"), so a start the options gained was refused."""
    assert deq_options.INITIAL_GUESSES is option_names.INITIAL_GUESSES  # one table, read without torch
    monkeypatch.setattr(option_names, "INITIAL_GUESSES", (*option_names.INITIAL_GUESSES, "another"))
    args = build_parser().parse_args([*words, *required, "--initial-guess", "another"])
    assert args.initial_guess == "another"


@pytest.mark.parametrize("words, required", COMMANDS)
def test_a_solver_alone_starts_from_zero_and_an_initial_guess_overrides_it(words, required):
    parser, command = build_parser(), [*words, *required]
    alone = fixed_point_settings(parser.parse_args([*command, "--solver", "anderson"]))
    # A solver asks for a solve to the tolerance: passes 0, whatever the checkpoint declares.
    assert alone == {"passes": 0, "solver": "anderson", "simultaneous_solver": "", "sequential_solver": "",
                     "initial_guess": "zero", **PER_MODE_GUESSES}
    guessed = fixed_point_settings(parser.parse_args([*command, "--solver", "anderson", "--initial-guess", "learned"]))
    assert guessed == {**alone, "initial_guess": "learned"}
    assert fixed_point_settings(parser.parse_args(command)) == {}  # neither flag: the model's own, per mode


@pytest.mark.parametrize("words, required", COMMANDS)
def test_the_help_says_a_solver_starts_from_zero(words, required):
    """Before: --solver's help did not say it overrides the checkpoint's start as --initial-guess zero would."""
    assert "as if with --initial-guess zero" in help_of(words, "solver")
    assert "zero with --solver" in help_of(words, "initial_guess")
