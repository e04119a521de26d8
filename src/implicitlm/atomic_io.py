"""Atomic file writes: a temporary file beside the target, renamed into place once complete."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Run ``write`` on a temporary file beside ``path``, then move it into place.

    On any failure the temporary file is removed and an existing ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    os.chmod(temporary, 0o644)  # mkstemp's private 0600 would outlive the rename
    try:
        write(Path(temporary))
        _fsync(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, value: Any) -> None:
    atomic_write(path, lambda temporary: temporary.write_text(json.dumps(value, indent=2)))


def _fsync(path: Path) -> None:
    # Without it a crash after the rename could leave a renamed but empty file.
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
