"""The one exception hierarchy, and the helpers that keep its messages to one line.

Every error implicitlm raises derives from ``ImplicitLMError``, so a caller can catch them
all. Bad input (``OptionError``, ``DataError`` and the like) also derives from
``ValueError`` and exits with code 2; ``NumericalFault`` derives from ``RuntimeError`` and
exits with code 1: the input was valid, but the run cannot go on without giving a wrong
answer.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Sequence

# Values quoted in a message are cut to this many characters, so a message stays short.
QUOTED_CHARS = 60


class ImplicitLMError(Exception):
    """The base of every error implicitlm raises; its message is one line.

    A message that tells what to pass instead names the library's own arguments, as Python
    spells them (``resume=True``, ``overwrite=True``, ``group``), and lists them in
    ``arguments``: the command line shows each as its flag (``--resume``), from one table.
    """

    def __init__(self, *args: object, arguments: Sequence[str] = ()):
        super().__init__(*args)
        self.arguments = tuple(arguments)


class OptionError(ImplicitLMError, ValueError):
    """An invalid option; the message is one line naming the option."""


class DataError(ImplicitLMError, ValueError):
    """A malformed or inconsistent data file; the message is one line naming the file."""


class TargetExistsError(ImplicitLMError, FileExistsError):
    """A writer's target holds finished work, or work of another kind (a saved model's, a
    training run's), or another process is writing it."""


class MissingFileError(ImplicitLMError, FileNotFoundError):
    """A file or folder the input names is not there; the message is one line naming it."""


class OutOfRangeError(ImplicitLMError, IndexError):
    """A read past the end of what a file holds; the message names the file and the range."""


class NetworkError(ImplicitLMError, ConnectionError):
    """A download that could not reach its server; the message says how to do without it."""


class ArgumentTypeError(ImplicitLMError, TypeError):
    """An argument of the wrong type (a keyword a function does not take), where Python and
    transformers callers expect a TypeError."""


class NumericalFault(ImplicitLMError, RuntimeError):
    """NaN or Inf in a loss, gradient or iterate, or a fixed point not reached where that is fatal.

    The message is one line naming where it happened and what was kept."""


def check_header(
    header: dict[str, Any], keys: Iterable[str], version: int, source: object, what: str, optional: Iterable[str] = ()
) -> None:
    """``header`` (a file's JSON metadata) has every one of ``keys`` and format ``version``,
    and nothing but them and ``optional``: a misspelt key would otherwise be ignored."""
    keys = set(keys)
    missing = sorted(keys - set(header))
    if missing:
        raise DataError(f"{source}: expected keys {missing} in {what}")
    check_header_keys(header, sorted({*keys, *optional}), source, what)
    found = header["format_version"]
    if isinstance(found, bool) or found != version:
        raise DataError(f"{source}: expected format_version {version}, got {quoted(found)}")


def check_header_keys(header: dict[str, Any], known: Sequence[str], source: object, what: str) -> None:
    """Every key of ``header`` (a file's JSON metadata) is one of ``known``: a misspelt key
    would otherwise be ignored."""
    for key in header:
        if key not in known:
            raise DataError(f"{source}: unknown key {quoted(key)} in {what}{closest_hint(key, known)}")


def check_int(value: Any, source: object, field: str, minimum: int = 0) -> int:
    """``value`` (field ``field`` of ``source``) as an integer of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"{source}: expected {field!r} to be an integer >= {minimum}, got {quoted(value)}")
    return value


def closest_hint(key: Any, known: Sequence[str]) -> str:
    """For a message about an unknown key: the known one it most likely misspells, or all."""
    close = difflib.get_close_matches(key, known, n=1) if isinstance(key, str) else []
    return f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(known)})"


def quoted(value: Any) -> str:
    """``repr(value)``, cut short: repr escapes line breaks, so the result is one line."""
    text = repr(value)
    return text if len(text) <= QUOTED_CHARS else f"{text[:QUOTED_CHARS]}..."


def not_utf8(error: UnicodeDecodeError) -> str:
    """Where decoding failed, for a message."""
    return f"got byte {error.object[error.start]:#04x} at offset {error.start}, which is not UTF-8"


def first_line(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
