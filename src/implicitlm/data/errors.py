"""Errors raised by the data modules, and the header check their file formats share."""

from __future__ import annotations

from typing import Any, Iterable


class DataError(ValueError):
    """A malformed or inconsistent data file; the message is one line naming the file."""


def check_header(header: dict[str, Any], keys: Iterable[str], version: int, source: object, what: str) -> None:
    """``header`` (a file's JSON metadata) has every one of ``keys`` and format ``version``."""
    missing = sorted(set(keys) - set(header))
    if missing:
        raise DataError(f"{source}: expected keys {missing} in {what}")
    if header["format_version"] != version:
        raise DataError(f"{source}: expected format_version {version}, got {header['format_version']!r}")
