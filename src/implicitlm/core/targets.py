"""What every writer does before it writes: refuse finished work it was not told to replace,
hold its target against a second writer, and clear what a killed writer left.

A target is the file or folder a command writes (``--out``). Its lock is a hidden file
beside it, ``.NAME.lock``, held with the kernel's ``flock`` (a killed writer holds nothing)
and removed when the writer is done. Only the lock's holder may remove the temporaries
(``.NAME.XXXX.tmp``, and ``.NAME.old`` that a replacement killed between its renames left)
beside the target: anyone else's are work in progress.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import Iterable, Iterator

from .atomic_io import recover_replaced, remove_entry, retired
from .errors import ImplicitLMError

LOGGER = logging.getLogger("implicitlm")


class TargetExistsError(ImplicitLMError, FileExistsError):
    """A writer's target holds finished work, or another process is writing it."""


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


@contextlib.contextmanager
def writer_lock(target: str | os.PathLike) -> Iterator[None]:
    """Hold ``target`` for this process alone; a second writer is refused in one line."""
    path = lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = open(path, "a+", encoding="utf-8")
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
    """Remove the temporaries (``.NAME.XXXX.tmp``) a killed writer left beside ``target``;
    returns them. Call it holding ``target``'s ``writer_lock``."""
    target = Path(target).absolute()
    stale = sorted(target.parent.glob(f".{_glob_escape(target.name)}.*.tmp"))
    if target.exists() and retired(target).exists():  # killed while deleting what it replaced
        stale.append(retired(target))
    for path in stale:
        remove_entry(path)
    return stale


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


@contextlib.contextmanager
def exclusive_target(target: str | os.PathLike, overwrite: bool = False) -> Iterator[list[Path]]:
    """Everything a writer does first: hold ``target``, refuse finished work unless
    ``overwrite``, and remove a killed writer's temporaries (yielded, for the writer to say)."""
    with writer_lock(target):
        recover_replaced(target)
        refuse_existing(target, overwrite)
        stale = remove_stale_temporaries(target)
        if stale:
            LOGGER.warning(f"{target}: removed what a killed writer left: {', '.join(map(str, stale))}")
        yield stale


@contextlib.contextmanager
def exclusive_targets(targets: Iterable[str | os.PathLike], overwrite: bool = False) -> Iterator[list[Path]]:
    """``exclusive_target`` over the files one writer writes together (a record and its
    figure): all held, any of them finished work refused."""
    with contextlib.ExitStack() as stack:
        yield [path for target in targets for path in stack.enter_context(exclusive_target(target, overwrite))]
