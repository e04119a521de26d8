"""What every writer does before it writes: refuse finished work it was not told to replace,
hold its target against a second writer, and clear what a killed writer left.

A target is the file or folder a command writes (``--out``). Its lock is a hidden file
beside it, ``.NAME.lock``, held with the kernel's ``flock`` (a killed writer holds nothing)
and removed when the writer is done. Only the lock's holder may remove the temporaries
(``.NAME.XXXX.tmp``, and ``.NAME.old`` that a replacement killed between its renames left)
beside the target, or put back what a replacement kept aside (``.NAME.kept``): anyone
else's are work in progress.

A writer that builds a whole folder says which kind of folder it writes (``FolderKind``): it
writes into a new or empty folder or, with ``overwrite``, one of its own kind, where it
replaces only what it writes itself; a file, or a folder of anything else, is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .atomic_io import finish_replacement, remove_entry, retired, staged_directory
from .errors import TargetExistsError
from .run_folder import refuse_saved_work

LOGGER = logging.getLogger("implicitlm")


@dataclass(frozen=True)
class FolderKind:
    """The kind of folder a writer builds whole. ``name``: as a message says it ("a saved
    model"); ``marks``: patterns (``Path.glob``, under the folder) any of which, matched by
    no link, makes a folder one of this kind, unless one of ``foreign`` matches too (a
    catbAbI build holds token shards, but is more); ``entries``: patterns (``fnmatch``) of
    the names its writers write in the folder, which ``overwrite`` replaces. Any other entry
    of a folder of its kind (a user's notes) stays."""

    name: str
    marks: tuple[str, ...]
    entries: tuple[str, ...]
    foreign: tuple[str, ...] = ()

    def keeps(self, name: str) -> bool:
        """Whether an entry ``name`` of a folder replaced by this kind's writer stays."""
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in self.entries)

    def marked(self, folder: Path) -> bool:
        return self._matched(folder, self.marks) and not self._matched(folder, self.foreign)

    @staticmethod
    def _matched(folder: Path, patterns: tuple[str, ...]) -> bool:
        return any(not path.is_symlink() for pattern in patterns for path in folder.glob(pattern))

    def foreign_entries(self, folder: Path) -> list[str]:
        """The entries of ``folder`` that make it other work than this kind (a run's
        checkpoint holds a saved model's files, and its optimiser state)."""
        return sorted({path.relative_to(folder).parts[0] for pattern in self.foreign for path in folder.glob(pattern)
                       if not path.is_symlink()})


def refuse_another_kind(target: str | os.PathLike, kind: FolderKind) -> None:
    """``target`` must be a new or empty folder, or one of ``kind``: ``overwrite`` replaces
    what its writer writes there, and no writer of a folder may take a file, or a folder of
    other work (another writer's output, a user's files) for its own."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise TargetExistsError(f"{target}: not a folder (a file); {kind.name} is written as a folder")
    others = sorted(entry.name for entry in target.iterdir()) if target.is_dir() else []
    if others and not kind.marked(target):
        # Named: what makes it another kind's, not its files that this kind's writer writes too.
        named = kind.foreign_entries(target) or others
        raise TargetExistsError(
            f"{target}: holds other work than {kind.name} ({', '.join(named[:5])}); write it into a new or empty folder"
        )


def refuse_existing(target: str | os.PathLike, overwrite: bool = False) -> None:
    """``target`` must not exist (an empty folder is nothing to lose) unless ``overwrite``."""
    target = Path(target)
    if overwrite or not (target.exists() or target.is_symlink()):
        return
    if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
        return
    raise TargetExistsError(f"{target}: exists; replace it with overwrite=True", arguments=("overwrite",))


def lock_path(target: str | os.PathLike) -> Path:
    target = Path(target).absolute()
    return target.with_name(f".{target.name}.lock")


def refuse_unwritable(target: str | os.PathLike) -> None:
    """What no writer writes, with or without ``overwrite``: a symbolic link (the write would
    replace it, or land where it leads), a device, pipe or socket (replaced by a file), and
    what ``run_folder.refuse_saved_work`` keeps from writers: a model's and a run's own."""
    target = Path(target)
    if target.is_symlink():
        raise TargetExistsError(f"{target}: a symbolic link; write into a file or folder of its own, not through a link")
    if target.exists() and not (target.is_file() or target.is_dir()):
        raise TargetExistsError(f"{target}: not a file or a folder (a device, a pipe or a socket); "
                                "write into a file or folder of its own")
    refuse_saved_work(target)


@contextlib.contextmanager
def writer_lock(target: str | os.PathLike) -> Iterator[None]:
    """Hold ``target`` for this process alone, once ``refuse_unwritable`` has passed it; a
    second writer is refused in one line. The folders made to hold the lock are removed with
    it when they are empty (the writer failed): one another process wrote into meanwhile stays."""
    refuse_unwritable(target)
    path = lock_path(target)
    missing = _missing_folders(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _held(path, target):
            yield
    finally:
        for folder in missing:  # innermost first
            try:
                folder.rmdir()
            except FileNotFoundError:  # never made: its parent could not be
                continue
            except OSError:  # not empty: written into, by this writer or another
                break


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents up to the first that exists, innermost first."""
    missing = []
    while not (folder.exists() or folder.is_symlink()):
        missing.append(folder)
        folder = folder.parent
    return missing


@contextlib.contextmanager
def _held(path: Path, target: str | os.PathLike) -> Iterator[None]:
    while True:
        try:
            handle = open(path, "a+", encoding="utf-8")
        except FileNotFoundError:  # a failed writer removed the folder it made as we went to lock in it
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise TargetExistsError(f"{target}: another process is writing it (process {holder})") from None
        # The holder before us may have removed the file between our open and our lock:
        # a lock on an unlinked file holds nothing, so take the lock on the file now there.
        if _same_file(handle, path):
            break
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def _same_file(handle, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def remove_stale_temporaries(target: str | os.PathLike) -> list[Path]:
    """Remove the temporaries (``.NAME.XXXX.tmp``) a killed writer left beside ``target``,
    once a replacement it left half done is finished; returns them. Call it holding
    ``target``'s ``writer_lock``."""
    target = Path(target).absolute()
    finish_replacement(target)
    stale = sorted(target.parent.glob(f".{_glob_escape(target.name)}.*.tmp"))
    if target.exists() and retired(target).exists():  # killed while deleting what it replaced
        stale.append(retired(target))
    for path in stale:
        remove_entry(path)
    return stale


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


@contextlib.contextmanager
def exclusive_target(
    target: str | os.PathLike, overwrite: bool = False, kind: FolderKind | None = None
) -> Iterator[list[Path]]:
    """Everything a writer does first: hold ``target``, refuse finished work unless
    ``overwrite`` (and, for the writer of a ``kind`` of folder, any target of another kind),
    and remove a killed writer's temporaries (yielded, for the writer to say)."""
    with writer_lock(target):
        finish_replacement(target)
        if kind is not None:
            refuse_another_kind(target, kind)
        refuse_existing(target, overwrite)
        stale = remove_stale_temporaries(target)
        if stale:
            LOGGER.warning(f"{target}: removed what a killed writer left: {', '.join(map(str, stale))}")
        yield stale


@contextlib.contextmanager
def staged_folder(target: str | os.PathLike, overwrite: bool, kind: FolderKind) -> Iterator[Path]:
    """For a writer that builds all of its ``kind`` of folder in one go: ``exclusive_target``,
    and the folder to build in (``staged_directory``), which replaces ``target`` at the end."""
    with exclusive_target(target, overwrite, kind), staged_directory(target, kind.keeps) as staging:
        yield staging


@contextlib.contextmanager
def exclusive_targets(targets: Iterable[str | os.PathLike], overwrite: bool = False) -> Iterator[list[Path]]:
    """``exclusive_target`` over the files one writer writes together (a record and its
    figure): all held, any of them finished work refused."""
    with contextlib.ExitStack() as stack:
        yield [path for target in targets for path in stack.enter_context(exclusive_target(target, overwrite))]
