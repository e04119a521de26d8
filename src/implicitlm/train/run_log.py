"""Training logs: one JSON object per line, mirrored to TensorBoard scalars through
accelerate's tracker."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ..core.atomic_io import atomic_write, remove_entry
from ..core.errors import DataError
from ..core.run_folder import CHECKPOINTS, RUN_ENTRIES, RUN_LINKS, latest_checkpoint, refuse_in_place_of_links, step_directories
from ..core.targets import TargetExistsError, writer_lock

LOGGER = logging.getLogger("implicitlm")
TENSORBOARD = "tensorboard"
# Where an overwriting run keeps the earlier run until its first checkpoint (``.moving`` while
# the entries are on their way there or back). Not temporaries (``.*.tmp``) that the next run
# removes: until that checkpoint, they hold the folder's only run.
EARLIER_RUN = ".earlier_run"
EARLIER_RUN_MOVING = f"{EARLIER_RUN}.moving"


def existing_run(out_dir: str | Path) -> list[str]:
    """The entries of an earlier training run in ``out_dir`` (none for a new or unrelated folder)."""
    out = Path(out_dir)
    found = [name for name in RUN_ENTRIES if (out / name).exists() or (out / name).is_symlink()]
    # Beside a run, its links (or their copies: core.run_folder.link_latest_checkpoint) are its own.
    return found + [name for name in RUN_LINKS if (out / name).is_symlink() or (found and (out / name).exists())]


def refuse_earlier_run(out_dir: str | Path, overwrite: bool) -> None:
    """A new run may not start on top of an earlier one: it would append to the old log, and
    pruning would delete checkpoints the new run did not write. Without ``overwrite``, an
    earlier run is a FileExistsError."""
    if overwrite:
        return
    stopped = stopped_before_first_checkpoint(out_dir)
    if stopped:
        raise TargetExistsError(stopped, arguments=("overwrite",))
    found = existing_run(out_dir)
    if found:
        raise TargetExistsError(
            f"{out_dir}: holds a training run ({', '.join(found)}); continue it with resume=True or replace it with "
            "overwrite=True", arguments=("resume", "overwrite"),
        )


def stopped_before_first_checkpoint(out_dir: str | Path) -> str | None:
    """What ``out_dir`` holds where a run was stopped before its first checkpoint, to say: its
    logs, and nothing a resume could start from. None where it holds no such run."""
    found = existing_run(out_dir)
    if not found or latest_checkpoint(out_dir) is not None:
        return None
    return (f"{out_dir}: holds a run stopped before its first checkpoint ({', '.join(found)}): nothing to resume; "
            "start it again with overwrite=True")


@contextlib.contextmanager
def run_folder_lock(out_dir: str | Path, enabled: bool = True):
    """Hold ``out_dir`` for one run at a time: a second run on the same folder would mix its
    metrics into the first's and race it on every checkpoint rename. Symbolic links inside
    the run folder are refused too (the folder itself, as every writer's target, by
    ``writer_lock``): writes would land outside it, or fail at the first save.
    An earlier run that a killed overwriting run left set aside is settled first."""
    if not enabled:
        yield
        return
    with writer_lock(out_dir):
        settled = settle_earlier_run(out_dir)
        if settled:
            LOGGER.warning(f"{out_dir}: {settled}")
        refuse_links(Path(out_dir))
        refuse_in_place_of_links(out_dir)
        yield


def refuse_links(out_dir: Path) -> None:
    """A run folder's entries, and everything under them, must be its own files and folders."""
    for name in RUN_ENTRIES:
        entry = out_dir / name
        links = [entry] if entry.is_symlink() else [p for p in entry.rglob("*") if p.is_symlink()] if entry.is_dir() else []
        if links:
            raise DataError(
                f"{links[0]}: a symbolic link inside a run folder; a run writes only its own files there"
            )


@contextlib.contextmanager
def earlier_run_set_aside(out_dir: str | Path, enabled: bool = True):
    """Move an earlier run's entries out of the new run's way (``--overwrite``), and delete
    them only once the new run has written a checkpoint: a run that fails before its first
    (a full disk, bad data) puts the earlier run back as it was, and so does the next holder
    of the folder's lock after a run killed before its first (``settle_earlier_run``)."""
    out = Path(out_dir)
    found = existing_run(out) if enabled else []
    if not found:
        with _removed_on_bad_input(out) if enabled else contextlib.nullcontext():
            yield
        return
    moving, aside = out / EARLIER_RUN_MOVING, out / EARLIER_RUN
    moving.mkdir()
    try:
        for name in found:
            os.replace(out / name, moving / name)
    except BaseException:
        _move_back(out, moving)
        raise
    os.replace(moving, aside)
    try:
        yield
    except BaseException:
        if not _checkpointed(out):
            _put_back(out)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def _removed_on_bad_input(out: Path):
    """A new run stopped by bad input before its first checkpoint (words found unreadable as
    its batches are drawn) leaves none of its entries, nor the folder it made for them: there
    is nothing of it to resume. Its log stays after another fault (a non-finite loss, a full
    disk), which it tells of; any other file in the folder is another's, and stays."""
    made = not out.exists()
    try:
        yield
    except ValueError:
        if not _checkpointed(out):
            for name in existing_run(out):
                remove_entry(out / name)
            if made and out.is_dir() and not any(out.iterdir()):
                out.rmdir()
        raise


def settle_earlier_run(out_dir: str | Path) -> str | None:
    """Finish what a run killed while an earlier run waited set aside left; what was done, to
    say. Before the killed run's first checkpoint the earlier run is still the folder's run,
    and is put back; after it, the killed run replaced it, and resumes."""
    out = Path(out_dir)
    if _own_folder(out / EARLIER_RUN) and _checkpointed(out):
        shutil.rmtree(out / EARLIER_RUN)
        return "removed the earlier run that a stopped run, which had written a checkpoint, replaced"
    if _own_folder(out / EARLIER_RUN):
        _put_back(out)
    elif _own_folder(out / EARLIER_RUN_MOVING):
        _move_back(out, out / EARLIER_RUN_MOVING)
    else:
        return None
    return "put back the earlier run, which a run stopped before its first checkpoint had set aside"


def settle_before_resuming(out_dir: str | Path) -> None:
    """A resume reads its run's settings and weights before the trainer holds the folder: what
    a killed overwriting run left is settled first, holding the folder's lock a moment."""
    out = Path(out_dir)
    if _own_folder(out / EARLIER_RUN) or _own_folder(out / EARLIER_RUN_MOVING):
        with run_folder_lock(out):
            pass


def _own_folder(path: Path) -> bool:
    # A link there is no folder of ours: its entries would be moved into the run, or deleted.
    return path.is_dir() and not path.is_symlink()


def _checkpointed(out: Path) -> bool:
    return bool(step_directories(out / CHECKPOINTS))


def _put_back(out: Path) -> None:
    """The earlier run in place of the new one's entries. Renamed back to ``.moving`` first: a
    kill while the entries go back leaves a folder with some of them, and none of the new run's."""
    for name in existing_run(out):
        remove_entry(out / name)
    os.replace(out / EARLIER_RUN, out / EARLIER_RUN_MOVING)
    _move_back(out, out / EARLIER_RUN_MOVING)


def _move_back(out: Path, moving: Path) -> None:
    for entry in moving.iterdir():
        os.replace(entry, out / entry.name)
    moving.rmdir()


def tracking_options(out_dir: str | Path) -> dict[str, Any]:
    """``Accelerator`` arguments under which ``RunLog`` writes TensorBoard to ``out_dir/tensorboard``."""
    return {"log_with": TENSORBOARD, "project_dir": str(out_dir)}


class RunLog:
    """Writes on the main process only. ``accelerator``: made with ``tracking_options``.
    ``keep_before_step``: a resumed run first drops the records of steps from that one
    on, which the interrupted run logged after its last checkpoint and will log again."""

    def __init__(self, out_dir: str | Path, accelerator, keep_before_step: int | None = None) -> None:
        self.accelerator = accelerator
        self.enabled = accelerator.is_main_process
        if not self.enabled:
            return
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if keep_before_step is not None:
            _truncate(out / "metrics.jsonl", keep_before_step)
        self._jsonl = (out / "metrics.jsonl").open("a", encoding="utf-8")
        accelerator.init_trackers(TENSORBOARD)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self._jsonl.flush()
        # Scalars only: the phase and solver names are in the JSONL.
        self.accelerator.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._jsonl.close()
        # Not accelerator.end_training(): that also ends the process group, which the
        # caller may still need (a final evaluation under torchrun).
        for tracker in self.accelerator.trackers:
            tracker.finish()

    def __enter__(self) -> "RunLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _truncate(path: Path, keep_before_step: int) -> None:
    """Keep the records of steps before ``keep_before_step``. The last line may be cut
    short by a kill mid-write and is dropped; any other line that is not a record of this
    log is damage, reported with the file and line rather than guessed around."""
    if not path.is_file():
        return
    lines = path.read_bytes().split(b"\n")
    kept = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        record = _record(raw)
        if record is None:
            if number >= len(lines) - 1:  # the last line, cut by a kill
                continue
            raise DataError(f"{path}:{number}: expected a JSON object with an integer 'step' (a damaged training log)")
        if record["step"] < keep_before_step:
            kept.append(raw.decode("utf-8") + "\n")
    atomic_write(path, lambda temporary: temporary.write_text("".join(kept), encoding="utf-8"))


def _record(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return record if isinstance(step, int) and not isinstance(step, bool) else None
