"""The ``implicitlm`` command line: one module per command group, each command parsing its
arguments and calling the library; heavy imports happen inside the command that runs."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Sequence

from .arguments import Parser, as_flags, command_flags
from .data import add_catbabi, add_corpus_build, add_tokenizer_train
from .evaluate import add_aliases, add_eval
from .generate import add_generate
from .lm import add_lm_demo, add_lm_downstream, add_train
from .models import add_jacobian, add_models_import, add_models_list, add_models_show, add_options, add_report
from .solver import add_solver
from .words import add_demo, add_words_generate, add_words_train


USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    from ..core.errors import NumericalFault

    try:
        if hasattr(args, "check"):
            args.check(args)  # what the command was given, by its files: before the libraries load (seconds)
        _quiet_libraries()
        args.run(args)
    except USER_ERRORS as error:
        # Bad input is reported in one line, never as a traceback. What a writer made before
        # it met it, it removes itself (core.targets.writer_lock): only it knows what is its own.
        return _fail(error, 2, parser, args)
    except BrokenPipeError:
        # The reader closed the pipe (`| head`): the rest of the output has no one to read it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (NumericalFault, OSError) as error:
        # Valid input, but the run cannot go on: NaN/Inf, a fatal non-convergence, a full disk.
        return _fail(error, 1, parser, args)
    except _training_interrupted() as stopped:
        hint = "; continue with --resume" if hasattr(args, "resume") else ""
        print(f"implicitlm: {stopped}{hint}", file=sys.stderr)
        return stopped.exit_code
    except KeyboardInterrupt:
        print("implicitlm: interrupted", file=sys.stderr)
        return 130
    return 0


def _training_interrupted() -> type:
    """The error of a stopped training run. An except clause names it only once an error gets
    that far: its module loads torch, which a command that needs none (``models list``) skips."""
    from ..train.guard import TrainingInterrupted

    return TrainingInterrupted


def _fail(error: BaseException, code: int, parser, args) -> int:
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        message = f"{error.filename}: {error.strerror}"  # not "[Errno 17] File exists: 'x'"
    else:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
    message = as_flags(message, getattr(error, "arguments", ()), command_flags(parser, args.run))
    print(f"implicitlm: error: {message}", file=sys.stderr)
    return code


def _quiet_libraries() -> None:
    # Saving and loading a checkpoint is instant; the libraries' own progress bars are noise.
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    # Without a network the hub logs each of its retries as a warning before the request fails;
    # the failure itself reaches the user as our one error line.
    hub_logging.set_verbosity_error()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="implicitlm", description="Implicit language models.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_installed_version()}")
    commands = parser.add_subparsers(title="commands")
    add_demo(commands)
    words = commands.add_parser("words", help="word problems (state tracking)").add_subparsers(title="commands")
    add_words_generate(words)
    add_words_train(words)
    add_aliases(words, "words")  # words eval|convergence: eval length|convergence --task words
    models = commands.add_parser("models", help="the paper's model presets; import from Hugging Face")
    models = models.add_subparsers(title="commands")
    add_models_list(models)
    add_models_show(models)
    add_models_import(models)
    add_options(commands)
    tokenizer = commands.add_parser("tokenizer", help="tokenizers for language modelling")
    add_tokenizer_train(tokenizer.add_subparsers(title="commands"))
    corpus = commands.add_parser("corpus", help="language-model corpora as token shards")
    add_corpus_build(corpus.add_subparsers(title="commands"))
    add_catbabi(commands)
    add_train(commands)
    lm = commands.add_parser("lm", help="language models: perplexity, the CPU demo").add_subparsers(title="commands")
    add_aliases(lm, "lm")  # lm eval: eval length --task lm
    add_lm_demo(lm)
    add_lm_downstream(lm)
    add_generate(commands)
    add_eval(commands)
    add_report(commands)
    add_jacobian(commands)
    add_solver(commands)
    return parser


def _installed_version() -> str:
    """The installed package's version; a source tree run without installing (the GPU
    check's machine puts src/ on the path) has no metadata, and every command must still run."""
    try:
        return version("implicitlm")
    except PackageNotFoundError:
        return "(not installed: run from a source tree)"
