"""Atomic writes: a file or a folder is built under a temporary name beside its target and
renamed into place once complete.

A folder cannot replace another atomically: the old one is first renamed aside to
``.<name>.old``, then the new one moved in, then the old one deleted. A process killed
between the two renames leaves only ``.<name>.old``, which is the last complete version:
``recover_replaced`` puts it back. The entries of the old folder that the new one keeps (what
its writer does not write) wait in ``.<name>.kept`` meanwhile, which ``finish_replacement``
empties into the folder, old or new, if a process was killed before it did.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from safetensors import SafetensorError

from .errors import ImplicitLMError, first_line


class WriteError(ImplicitLMError, OSError):
    """A file that could not be written (a full disk); what it was to replace is intact."""


@contextlib.contextmanager
def writing(target: str | os.PathLike, part: str):
    """Around writing ``part`` of ``target``: a failure is one WriteError line naming both and
    the system's reason, whatever library's error type carried it."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as error:
        raise WriteError(f"{target}: could not be written ({part}: {system_reason(error)})") from None


def system_reason(error: BaseException) -> str:
    """The operating system's reason for ``error`` ("No space left on device"), which torch
    and safetensors wrap in errors of their own (the OSError as the context of a
    RuntimeError; "os error 28" in a SafetensorError's text); else its first line."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        code = re.search(r"\(os error (\d+)\)", str(cause))
        if code:
            return os.strerror(int(code.group(1)))
        cause = cause.__cause__ or cause.__context__
    return first_line(error)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Run ``write`` on a temporary file beside ``path``, then move it into place.

    On any failure the temporary file is removed and an existing ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = _beside(path, tempfile.mkstemp)
    os.close(descriptor)
    try:
        write(Path(temporary))
        # After the write: mkstemp's private 0600, or that of a writer that replaced the file
        # (safetensors), would outlive the rename.
        os.chmod(temporary, file_mode())
        _fsync(Path(temporary))
        _rename_onto(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def file_mode(folder: bool = False) -> int:
    """The mode a new file (or folder) gets under the process's umask."""
    umask = os.umask(0o022)  # the only way to read it is to set it
    os.umask(umask)
    return (0o777 if folder else 0o666) & ~umask


@contextlib.contextmanager
def following_umask(folder: str | os.PathLike) -> Iterator[None]:
    """Files written into ``folder`` during the block get the umask's mode: safetensors writes
    its files private (0600) whatever the umask, so that a saved checkpoint could not be shared."""
    folder = Path(folder)
    before = _file_stamps(folder)
    yield
    for path, stamp in _file_stamps(folder).items():
        if before.get(path) != stamp:
            os.chmod(path, file_mode())


def _file_stamps(folder: Path) -> dict[Path, tuple[int, int]]:
    stamps = {}
    for path in folder.iterdir() if folder.is_dir() else ():
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            stamps[path] = (stat.st_ino, stat.st_mtime_ns)
    return stamps


def atomic_symlink(path: str | os.PathLike, points_to: str) -> None:
    """Make ``path`` a symbolic link to ``points_to`` in one rename: a reader finds the old
    link or the new one, never none. A folder or file at ``path`` is not replaced."""
    path = Path(path)
    descriptor, temporary = _beside(path, tempfile.mkstemp)
    os.close(descriptor)
    os.unlink(temporary)  # the unique name only: a link cannot be made over the file
    try:
        os.symlink(points_to, temporary)
        if path.exists() and not path.is_symlink():
            raise WriteError(f"{path}: not a symbolic link, so not replaced by one")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _rename_onto(temporary: str, target: Path) -> None:
    """The last step of a write; its error (a folder in the way) names the target, not the
    temporary name the user never chose."""
    try:
        os.replace(temporary, target)
    except OSError as error:
        error.filename, error.filename2 = str(target), None
        raise


def _beside(target: Path, make: Callable[..., Any]) -> Any:
    """``make`` (mkstemp, mkdtemp) a temporary entry beside ``target``; an error names the
    target (a read-only folder, a full disk), not a temporary name the user never chose."""
    try:
        return make(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as error:
        error.filename = str(target)
        raise


def write_json(path: str | os.PathLike, value: Any) -> None:
    atomic_write(path, lambda temporary: temporary.write_text(json.dumps(value, indent=2)))


def _fsync(path: Path) -> None:
    # Without it a crash after the rename could leave a renamed but empty file.
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


@contextlib.contextmanager
def staged_directory(target: str | os.PathLike, keeps: Callable[[str], bool] = lambda name: False) -> Iterator[Path]:
    """A fresh empty folder to build in; it becomes ``target`` when the block ends without
    error, replacing an existing ``target`` (the caller has checked that it may), whose
    entries named as ``keeps`` says, and not written anew, stay. On any failure the temporary
    folder is removed and ``target`` is left as it was."""
    # Normalised: the staging folder goes beside "run/.." (or "."), never inside it.
    target = Path(os.path.abspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(_beside(target, tempfile.mkdtemp))
    try:
        os.chmod(staging, file_mode(folder=True))  # mkdtemp's private 0700 would outlive the rename
        yield staging
        _move_into_place(staging, target, keeps)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def remove_entry(path: Path) -> None:
    """Remove a file, a symbolic link (not what it points to) or a folder with its contents."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def recover_replaced(target: str | os.PathLike) -> None:
    """Finish a replacement of ``target`` that a killed process left half done."""
    # Absolute: "." or "run/.." names no entry of its own, beside which the retired one waits.
    target = Path(os.path.abspath(target))
    if not target.name:
        return  # the root folder, which nothing replaces
    old = retired(target)
    if not target.exists() and old.is_dir():
        os.replace(old, target)


def finish_replacement(target: str | os.PathLike) -> None:
    """``recover_replaced``, and the entries a replacement kept put back into ``target``. Only
    the holder of ``target``'s lock may call it: a replacement in progress has them aside."""
    target = Path(os.path.abspath(target))
    recover_replaced(target)
    _put_kept_back(target)


def _move_into_place(staging: Path, target: Path, keeps: Callable[[str], bool]) -> None:
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        os.replace(staging, target)  # rename(2) replaces an empty folder
        return
    old = retired(target)
    shutil.rmtree(old, ignore_errors=True)
    try:
        _set_kept_aside(target, keeps, written=set(os.listdir(staging)))
        os.replace(target, old)
    except BaseException:
        _put_kept_back(target)
        raise
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(old, target)
        _put_kept_back(target)
        raise
    shutil.rmtree(old, ignore_errors=True)
    _put_kept_back(target)


def _set_kept_aside(target: Path, keeps: Callable[[str], bool], written: set[str]) -> None:
    kept = [entry.name for entry in target.iterdir() if keeps(entry.name) and entry.name not in written]
    if kept:
        kept_aside(target).mkdir(exist_ok=True)
    for name in kept:
        os.replace(target / name, kept_aside(target) / name)


def _put_kept_back(target: Path) -> None:
    kept = kept_aside(target)
    if not kept.is_dir() or kept.is_symlink():
        return
    target.mkdir(exist_ok=True)
    for entry in kept.iterdir():
        os.replace(entry, target / entry.name)
    kept.rmdir()


def kept_aside(target: Path) -> Path:
    """Where the entries of a folder being replaced that its replacement keeps wait."""
    return target.with_name(f".{target.name}.kept")


def retired(target: Path) -> Path:
    """Where a folder being replaced waits, until its replacement is in place."""
    return target.with_name(f".{target.name}.old")
