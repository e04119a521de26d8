"""MkDocs hook: the handbook's references that are generated from the code at build time, so
that they cannot fall behind it.

A page asks for one by a line of its own, ``<!-- generated: NAME -->``:

- ``cli``: the ``--help`` of ``implicitlm`` and of every command under it, from the parser the
  command line builds (``implicitlm.cli.build_parser``);
- ``model-options``: the ``--model`` keys of every family and the ``fixed_point`` keys, from the
  tables ``implicitlm options`` prints (``implicitlm.models.loading.model_option_tables``);
- ``training-options words`` / ``training-options lm``: a trainer's ``--train`` keys
  (``implicitlm.cli.arguments.training_option_table``).

An unknown name fails the build.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any, Iterator

MARKER = re.compile(r"^<!-- generated: ([a-z-]+)(?: ([a-z]+))? -->$", flags=re.MULTILINE)
# The width --help is wrapped to on the page (argparse reads COLUMNS).
HELP_COLUMNS = "100"


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda match: _generated(match.group(1), match.group(2), page.file.src_path), markdown)


def _generated(name: str, argument: str | None, page: str) -> str:
    if name == "cli" and argument is None:
        return command_reference()
    if name == "model-options" and argument is None:
        from implicitlm.models.loading import model_option_tables

        return "\n\n".join(option_table(*table) for table in model_option_tables())
    if name == "training-options" and argument in ("words", "lm"):
        from implicitlm.cli.arguments import training_option_table

        return option_table(*training_option_table(argument))
    raise ValueError(f"{page}: unknown generated section {name!r} {argument or ''}")


def command_reference() -> str:
    """A section per command, root first, each with its ``--help`` as the command prints it."""
    from implicitlm.cli import build_parser

    sections = []
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        for path, parser in _commands(["implicitlm"], build_parser()):
            level = "#" * min(len(path) + 1, 4)
            sections.append(f"{level} `{' '.join(path)}`\n\n```text\n{parser.format_help().rstrip()}\n```")
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n\n".join(sections)


def _commands(path: list[str], parser: argparse.ArgumentParser) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from _commands([*path, name], command)


def option_table(title: str, defaults: dict[str, Any], meanings: dict[str, str]) -> str:
    """One options table: key, default (as a KEY=VALUE option takes it), meaning."""
    rows = [f"**{_cell(title.rstrip(':'))}**", "", "| key | default | meaning |", "|---|---|---|"]
    for name, default in defaults.items():
        value = json.dumps(default, separators=(",", ":"))
        rows.append(f"| `{name}` | `{_cell(value)}` | {_cell(meanings[name])} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
