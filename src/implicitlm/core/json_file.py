"""Reading untrusted text and JSON files, every fault turned into a one-line DataError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from .errors import DataError, first_line, not_utf8


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
    text = read_utf8(path, what)
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{error.lineno}: expected JSON ({what}): {error.msg}") from None
    except RecursionError:
        raise DataError(f"{path}: expected JSON ({what}), got nesting too deep to read") from None
    # An integer of more digits than Python converts, or a refused constant.
    except ValueError as error:
        raise DataError(f"{path}: expected JSON ({what}): {first_line(error)}") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: expected a JSON object ({what}), got {type(value).__name__}")
    return value


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; nothing this project writes uses them.
    raise ValueError(f"{name} is not a JSON number")
