"""Checks of the commands a page shows but no test can run (paper-scale training, several
processes, a GPU, the network): each command is parsed by the parser that would run it, and
what it names is looked up, so a renamed flag, preset, option key, script or task fails CI
although the command itself never runs.

``check_block(code)`` returns one line per problem (empty: every command checks out).
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\S*)$")
# A checkpoint or shard folder a command reads: names written in capitals stand for the reader's own.
PLACEHOLDER_VOCABULARY = 256


def shell_commands(code: str) -> list[list[str]]:
    """The block's commands as argument lists: continuations joined, comments and leading
    ``NAME=value`` environment settings dropped, variables set in the block substituted."""
    variables: dict[str, str] = {}
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(re.sub(r"\$(\w+)", lambda match: variables.get(match.group(1), match.group(0)), line), comments=True)
        while words and ASSIGNMENT.match(words[0]):
            name, value = ASSIGNMENT.match(words.pop(0)).groups()
            if not words:  # a line of its own sets a variable for the lines after it
                variables[name] = value
        if words:
            commands.append(words)
    return commands


def check_block(code: str) -> list[str]:
    problems = []
    for words in shell_commands(code):
        check = CHECKS.get(Path(words[0]).name)
        if check is None:
            problems.append(f"{shlex.join(words)}: no check for the command {words[0]!r}")
            continue
        problem = check(words)
        if problem:
            problems.append(f"{shlex.join(words)}: {problem}")
    return problems


def _parse_refusal(parse: Callable[[], object]) -> tuple[object | None, str | None]:
    """What ``parse`` returns, or the last line the parser printed as it refused."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(io.StringIO()):
            return parse(), None
    except SystemExit:
        lines = printed.getvalue().strip().splitlines()
        return None, lines[-1] if lines else "refused by its parser"


def check_implicitlm(words: list[str]) -> str | None:
    from implicitlm.cli import build_parser

    args, refusal = _parse_refusal(lambda: build_parser().parse_args(words[1:]))
    if refusal:
        return refusal
    try:
        _check_named_things(args)
    except Exception as error:  # the library's own one-line refusal of the name
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return None


def _check_named_things(args) -> None:
    """The presets, groups and option keys the command names, resolved as its run would."""
    from implicitlm.data.groups import get_group
    from implicitlm.models import config_from_options
    from implicitlm.presets import load_preset, merged_options, model_kind, model_options_from
    from implicitlm.train.config import TrainConfig
    from implicitlm.train.runs import lm_model_config, word_model_config, word_train_config

    if getattr(args, "group", None):
        get_group(args.group)
    preset = getattr(args, "preset", None)
    presets = load_preset(preset) if preset else {}
    command = args.run.__name__
    if command == "_run_words_train":
        kind = "explicit" if args.explicit else "implicit"
        config = word_train_config(presets, kind, dict(args.train))
        word_model_config(presets, kind, config, dict(args.model))
    elif command == "_run_train":
        model_options = dict(args.model)
        if args.model_preset:
            model_options_from(args.model_preset)
        kind = model_kind({} if args.init_from else presets, model_options)
        TrainConfig.for_task("lm", **merged_options(presets, "train", kind, dict(args.train)))
        if args.init_from:
            config_from_options(model_options)
        else:
            base = model_options_from(args.model_preset) if args.model_preset else {}
            lm_model_config(presets, kind, PLACEHOLDER_VOCABULARY, model_options, base)


def check_torchrun(words: list[str]) -> str | None:
    if "-m" not in words or words[words.index("-m") + 1] != "implicitlm":
        return "torchrun without -m implicitlm"
    return check_implicitlm(words[words.index("-m") + 1:])


def check_lm_eval(words: list[str]) -> str | None:
    from lm_eval._cli.harness import HarnessCLI

    from implicitlm.eval.lm_eval_command import PROG

    saved = sys.argv
    sys.argv = [PROG, *words[1:]]
    try:
        args, refusal = _parse_refusal(HarnessCLI().parse_args)
    finally:
        sys.argv = saved
    if refusal:
        return refusal
    given = args.tasks if isinstance(args.tasks, list) else [args.tasks]  # a list in lm-eval 0.4.10 on
    unknown = [task for text in given for task in text.split(",") if task not in lm_eval_task_names()]
    return f"no lm-eval task {unknown[0]!r}, shipped or lm-eval's" if unknown else None


@functools.cache
def lm_eval_task_names() -> frozenset[str]:
    """lm-eval's task names and the shipped local tasks' (indexing them takes seconds)."""
    from lm_eval.tasks import TaskManager

    from implicitlm.eval.lm_eval_tasks import LOCAL_TASKS_DIR

    return frozenset(TaskManager(include_path=str(LOCAL_TASKS_DIR)).all_tasks)


def check_script(words: list[str]) -> str | None:
    script = ROOT / words[1]
    return None if script.is_file() else f"no script {words[1]}"


def check_source(words: list[str]) -> str | None:
    """Only the venv that scripts/setup.sh creates is activated."""
    if words[1:] != [".venv/bin/activate"]:
        return "only .venv/bin/activate (which scripts/setup.sh creates) is sourced"
    return None if ".venv" in (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8") else "scripts/setup.sh makes no .venv"


def check_python(words: list[str]) -> str | None:
    if words[1:2] != ["benchmarks/run.py"]:
        return "only benchmarks/run.py is checked among scripts run with python"
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from run import parse_arguments
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return _parse_refusal(lambda: parse_arguments(words[2:]))[1]


# Standard tools a block may use to prepare files (a split of a text file, a folder).
SHELL_TOOLS = frozenset({"mkdir", "xzcat", "head", "tail"})


def check_shell_tool(words: list[str]) -> str | None:
    """Every command of a pipeline is one of the standard tools."""
    commands = [words[0], *(words[i + 1] for i, word in enumerate(words[:-1]) if word == "|")]
    strangers = [command for command in commands if command not in SHELL_TOOLS]
    return f"no check for {strangers[0]!r} in a pipeline" if strangers else None


def check_mkdocs(words: list[str]) -> str | None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        return f"no {mkdocs} (the docs extra installs it)"
    return None if words[1] in {"build", "serve"} else f"mkdocs {words[1]} is not a command the handbook builds with"


CHECKS = {
    "implicitlm": check_implicitlm,
    "torchrun": check_torchrun,
    "implicitlm-lm-eval": check_lm_eval,
    "bash": check_script,
    "source": check_source,
    "python": check_python,
    "mkdocs": check_mkdocs,
    **dict.fromkeys(SHELL_TOOLS, check_shell_tool),
}
