"""The one line a refused command prints: ``implicitlm: error: `` and the message."""

from __future__ import annotations

PREFIX = "implicitlm: error: "


def one_error_line(code: int, err: str | list[str]) -> str:
    """The one line on stderr (its text or its lines) of a command that exited with 2."""
    lines = err.strip().splitlines() if isinstance(err, str) else err
    assert code == 2, (code, err)
    return _only_error_line(lines)


def printed_error_line(capsys) -> str:
    """The one line on stderr of the command just refused (the caller checks its exit code)."""
    return _only_error_line(capsys.readouterr().err.strip().splitlines())


def _only_error_line(lines: list[str]) -> str:
    assert len(lines) == 1 and lines[0].startswith(PREFIX) and "Traceback" not in lines[0], lines
    return lines[0]
