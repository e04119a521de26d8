"""Folders written whole: built under a temporary name beside the target, then renamed into place.

A failure while building removes the temporary folder and leaves the target as it was. A
target that already exists is swapped out (renamed aside, then deleted once the new folder
is in place), so the caller must have checked that it may be replaced.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def staged_directory(target: str | os.PathLike) -> Iterator[Path]:
    """A fresh empty folder to build in; it becomes ``target`` when the block ends without error."""
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        os.chmod(staging, 0o755)  # mkdtemp's private 0700 would outlive the rename
        yield staging
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _move_into_place(staging: Path, target: Path) -> None:
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        os.replace(staging, target)  # rename(2) replaces an empty folder
        return
    retired = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".old"))
    os.replace(target, retired / target.name)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(retired / target.name, target)
        retired.rmdir()
        raise
    shutil.rmtree(retired, ignore_errors=True)
