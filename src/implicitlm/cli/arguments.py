"""The command line's parser class and the argument types its options share."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import sys
from typing import Any, Callable, Sequence


# argparse's refusals that a mistyped option causes or hides: unrecognized words, and a
# required option or group missing because its name was mistyped (--promt for --prompt).
OUTRANKED_BY_UNKNOWN_OPTIONS = ("unrecognized arguments", "the following arguments are required", "one of the arguments")


class Parser(argparse.ArgumentParser):
    """argparse reporting a bad option in one line, as every other input error is (its
    default prints the whole usage first). Subcommands inherit the class."""

    given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        # Kept for error(): argparse reports a missing required option before a mistyped one.
        self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        command = self._command(self.given) if message.startswith("unrecognized arguments") else self
        unknown = command._unknown_option(command.given)
        if unknown is not None and message.startswith(OUTRANKED_BY_UNKNOWN_OPTIONS):
            message = unknown
        self.exit(2, f"{command.prog}: error: {message} (see {command.prog} --help)\n")

    def _command(self, words: list[str]) -> "Parser":
        """The (sub)command parser that ``words`` name (this one where they name none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for index, word in enumerate(words):
                    if word in action.choices:
                        return action.choices[word]._command(words[index + 1:])
        return self

    def _unknown_option(self, words: list[str]) -> str | None:
        """The first of ``words`` that looks like an option this parser does not take, with
        the closest one it takes; None when every option given is known."""
        for word in words:
            if word == "--":
                break
            name = word.partition("=")[0]
            if not name.startswith("-") or name == "-" or self._negative_number_matcher.match(name):
                continue
            if name in self._option_string_actions or any(o.startswith(name) for o in self._option_string_actions if len(name) > 2):
                continue
            close = difflib.get_close_matches(name, [o for o in self._option_string_actions if o.startswith("--")], n=1)
            return f"unknown option {name}" + (f" (did you mean {close[0]}?)" if close else "")
        return None

    def _get_values(self, action, arg_strings):
        # Before Python 3.12, argparse drops a value that is exactly "--" ("--hard-prob=--") as if
        # it ended the options, and hands the option an empty list instead of refusing it.
        if arg_strings == ["--"] and action.nargs is None:
            raise argparse.ArgumentError(action, "expected a value, got '--'")
        return super()._get_values(action, arg_strings)


def add_run_options(p, trainer: str) -> None:
    """What both training commands take besides their data and presets: options, and what to
    do with a run already in --out."""
    p.add_argument("--model", type=model_option, action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.add_argument("--train", type=training_option, action="append", default=[], metavar="KEY=VALUE", help="training option, repeatable")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out (refused without it)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars: a plain line of step, loss, lr and tokens/s every log_every steps")
    p.epilog = options_epilog(trainer)


def add_overwrite_option(p, what: str) -> None:
    """The one way a command replaces finished work: without it, an existing target is refused."""
    p.add_argument("--overwrite", action="store_true", help=f"replace {what} (refused without it)")


def options_epilog(trainer: str | None) -> str:
    """Where a command taking --model (and --train) sends its reader for their keys: listing
    them needs the model classes, which import torch, and --help answers without it."""
    command = "implicitlm options" + (f" --trainer {trainer}" if trainer else "")
    return f"the keys of --model{' and --train' if trainer else ''}, their defaults and meanings: {command}"


def option_sections(trainer: str | None) -> str:
    """The keys of --model and, for a trainer ("words" or "lm"), of --train, with their
    defaults (before a preset changes them) and meanings."""
    from ..models.loading import model_options_help
    from ..core.schema import option_help

    sections = [model_options_help()]
    if trainer is not None:
        sections.append(option_help(*training_option_table(trainer)))
    return "\n\n".join(sections)


def training_option_table(trainer: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The --train keys of a trainer ("words" or "lm") as (title, defaults, meanings): the
    table ``implicitlm options --trainer`` prints and the handbook shows."""
    from ..train.config import OTHER_TASKS_FIELDS, TrainConfig, task_defaults

    title = f"training options of {trainer} (--train KEY=VALUE; a preset's values replace these defaults):"
    defaults = {
        name: value for name, value in task_defaults(trainer).items()
        if name != "task" and OTHER_TASKS_FIELDS.get(name, trainer) == trainer
    }
    return title, defaults, TrainConfig.FIELD_HELP


def key_value(text: str) -> tuple[str, Any]:
    """KEY=VALUE, the value parsed as JSON where it is JSON (numbers, booleans, lists,
    objects), else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
    # Nested too deep for the parser, or an integer of thousands of digits.
    except (RecursionError, ValueError):
        raise argparse.ArgumentTypeError(f"the value of {key!r} is too deeply nested or too long a number") from None


def model_option(text: str) -> tuple[str, Any]:
    """--model KEY=VALUE, KEY an option of some family's config; whether the family asked for
    takes it, the command checks once the model classes are imported."""
    from ..core.option_names import MODEL_OPTIONS

    return _known_key(key_value(text), MODEL_OPTIONS, "model option")


def training_option(text: str) -> tuple[str, Any]:
    """--train KEY=VALUE, KEY a training setting (one spelt as a former trainer did is refused
    with today's name)."""
    from ..core.migrations import refuse_renamed_training_options
    from ..core.option_names import TRAINING_SETTINGS

    option = key_value(text)
    _checked(lambda key: refuse_renamed_training_options({key: None}), option[0])
    return _known_key(option, TRAINING_SETTINGS, "training option")


def _known_key(option: tuple[str, Any], known: Sequence[str], what: str) -> tuple[str, Any]:
    from ..core.schema import check_known_keys

    _checked(lambda key: check_known_keys({key: None}, known, what), option[0])
    return option


def _number(text: str, convert, minimum, strict: bool, expected: str, maximum=math.inf):
    """``convert(text)``, at least ``minimum`` (above it when ``strict``), at most ``maximum``, finite."""
    try:
        value = convert(text)
        finite = math.isfinite(value)  # an integer of 309 digits or more overflows a float here
    except (ValueError, OverflowError):
        value, finite = math.nan, False
    if not (finite and minimum <= value <= maximum and not (strict and value == minimum)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, 0, True, "a positive integer")


def max_iter_budget(text: str) -> int:
    """A fixed-point budget: a number of passes (evaluations of the map), within the solver's limit."""
    from ..core.option_names import MAX_PASSES  # deq.options' own, without torch

    return _number(text, int, 1, False, f"a budget of 1 to {MAX_PASSES} passes", MAX_PASSES)


def pass_budget(text: str) -> int:
    """A budget of passes per solve: 0 (solve to the tolerance) to the solver's limit."""
    from ..core.option_names import MAX_PASSES

    return _number(text, int, 0, False, f"a number of passes from 0 (solve to the tolerance) to {MAX_PASSES}",
                   MAX_PASSES)


def non_negative_int(text: str) -> int:
    return _number(text, int, 0, False, "an integer >= 0")


def seed(text: str) -> int:
    """A seed torch.manual_seed takes: one beyond 2**63 - 1 overflows its integer."""
    return _number(text, int, 0, False, "a seed, an integer from 0 to 2**63 - 1", 2**63 - 1)


def positive_float(text: str) -> float:
    return _number(text, float, 0.0, True, "a positive number")


def fraction(text: str) -> float:
    return _number(text, float, 0.0, False, "a number in [0, 1]", 1.0)


def _checked(check: Callable[[str], object], text: str) -> str:
    """``text`` once ``check(text)`` passes: a library check run by the parser, before the
    command imports torch (seconds), its one-line error the parser's refusal of the option."""
    from ..core.errors import ImplicitLMError

    try:
        check(text)
    except ImplicitLMError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def device_name(text: str) -> str:
    """A device's name of a kind models run on; whether the machine has it, the command checks."""
    from ..core.devices import check_device_name

    return _checked(check_device_name, text)


def tokenizer_name(text: str) -> str:
    """A tokenizer folder, or a name that can be the hub's: a mistyped folder is not sent to the hub."""
    from ..core.hub import check_local_or_hub

    return _checked(lambda name: check_local_or_hub(name, "tokenizer"), text)


def preset_name(text: str) -> str:
    """A run preset's name, a JSON file or a checkpoint."""
    from ..presets.run_presets import check_preset_name

    return _checked(check_preset_name, text)


def model_preset_name(text: str) -> str:
    """A model preset's name (``implicitlm models list``), a JSON file or a checkpoint."""
    from ..presets.options import check_model_options_name

    return _checked(check_model_options_name, text)


def dtype_name(text: str) -> str:
    from ..core.devices import DTYPES

    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"dtype must be one of {', '.join(DTYPES)}; got {text!r}")
    return text


def _list_of(text: str, item, expected: str) -> list:
    try:
        values = [item(v) for v in text.split(",") if v.strip()]
    except argparse.ArgumentTypeError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated {expected}, got {text!r}")
    return values


def int_list(text: str) -> list[int]:
    return _list_of(text, positive_int, "positive integers")


def budget_list(text: str) -> list[int]:
    from ..core.option_names import MAX_PASSES

    return _list_of(text, max_iter_budget, f"budgets of 1 to {MAX_PASSES} passes")


def passes_list(text: str) -> list[int]:
    from ..core.option_names import MAX_PASSES

    return _list_of(text, max_iter_budget, f"numbers of passes of 1 to {MAX_PASSES}")


def position_list(text: str) -> list[int]:
    return _list_of(text, non_negative_int, "integers >= 0")


def float_list(text: str) -> list[float]:
    return _list_of(text, positive_float, "positive numbers")


# Library arguments whose flag has another name than the argument: the options dicts.
ARGUMENT_DESTS = {"model_options": "model", "train_options": "train"}


def command_flags(parser: argparse.ArgumentParser, run: Callable) -> dict[str, str]:
    """The flags of the (sub)command of ``parser`` that ``run`` runs, by their dest."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                if command.get_default("run") is run:
                    return {a.dest: a.option_strings[-1] for a in command._actions if a.option_strings}
                found = command_flags(command, run)
                if found:
                    return found
    return {}


def as_flags(message: str, arguments: Sequence[str], flags: dict[str, str]) -> str:
    """A library message as the command line says it: each of ``arguments`` (Python names
    the message spells ``name`` or ``name=value``) as its flag, ``--resume`` or
    ``--errors replace``; a name the command has no flag for, in the flags' spelling."""
    for name in arguments:
        dest = ARGUMENT_DESTS.get(name, name)
        flag = flags.get(dest, "--" + dest.replace("_", "-"))

        def spelt(match: re.Match, flag=flag) -> str:
            value = match.group(1)
            return flag if value in (None, "True") else f"{flag} {value.strip(chr(39) + chr(34))}"

        # Not inside a path: a folder named like the argument is no flag.
        message = re.sub(rf"(?<![/.\-])\b{re.escape(name)}(?:=('[^']*'|\"[^\"]*\"|[^\s,;()]+))?(?![\w='/])", spelt, message)
    return message
