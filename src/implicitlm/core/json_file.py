"""Reading untrusted text and JSON files, every fault turned into a one-line DataError.

An object that holds one key twice is refused: readers disagree on which value counts
(Python's json takes the last), so the file does not say one thing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Protocol

from .errors import DataError, first_line, not_utf8, quoted


class Readable(Protocol):
    """A path or an ``importlib.resources`` traversable: both read their bytes."""

    def read_bytes(self) -> bytes: ...


def check_regular(path: Path, what: str) -> None:
    """A path that exists but is no regular file (``/dev/zero``, a FIFO) is not "missing", and
    reading it would never end or block."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise DataError(f"{path}: expected {what}, got a device, FIFO or socket")


def read_utf8(path: Path | Readable, what: str) -> str:
    """The text of ``path``, which holds ``what`` (e.g. "a shard index"); any fault a one-line DataError."""
    if isinstance(path, Path):
        check_regular(path, what)
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file ({what})") from None
    except IsADirectoryError:
        raise DataError(f"{path}: expected {what}, got a directory") from None
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror or type(error).__name__})") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: expected UTF-8 text ({what}): {not_utf8(error)}") from None


def read_json_object(path: Path | Readable, what: str) -> dict[str, Any]:
    """The JSON object (a dict) held by ``path``, which holds ``what`` (e.g. "a shard index")."""
    value = parse_json(read_utf8(path, what), path, f"JSON ({what})", parse_constant=_refuse_constant)
    if not isinstance(value, dict):
        raise DataError(f"{path}: expected a JSON object ({what}), got {type(value).__name__}")
    return value


def parse_json(
    text: str, where: object, expected: str, line: int | None = None, parse_constant: Callable[[str], Any] | None = None
) -> Any:
    """``text`` parsed as JSON (``parse_constant`` as ``json.loads`` takes it), any fault a
    one-line DataError naming ``where`` and ``expected`` (e.g. "a JSON object"). ``text`` is
    the whole of ``where`` or, given ``line``, that line of it."""
    located = where if line is None else f"{where}:{line}"
    try:
        return json.loads(text, parse_constant=parse_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as error:
        # Of a whole file, the line the syntax breaks on.
        at = f"{where}:{error.lineno}" if line is None else located
        raise DataError(f"{at}: expected {expected}: {error.msg}") from None
    except RecursionError:
        raise DataError(f"{located}: expected {expected}, got nesting too deep to read") from None
    except DataError as error:  # a refused constant or a duplicate key
        raise DataError(f"{located}: expected {expected}: {error}") from None
    # An integer of more digits than Python converts.
    except ValueError as error:
        raise DataError(f"{located}: expected {expected}: {first_line(error)}") from None


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; nothing this project writes uses them.
    raise DataError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) < len(pairs):
        duplicate = next(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        raise DataError(f"duplicate key {quoted(duplicate)}")
    return value
