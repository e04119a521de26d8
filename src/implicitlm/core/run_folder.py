"""Where a training run keeps its checkpoints: ``RUN/checkpoints/step_NNNNNNN`` (a run of the
former word trainer: ``migrations.former_word_checkpoint``). Loading a model from a run
folder loads its latest checkpoint.

A run also keeps two relative symbolic links to its latest checkpoint, replaced in one rename
whenever it writes one: ``RUN/latest`` (the checkpoint folder) and ``RUN/config.json``
(``latest/config.json``). transformers reads ``RUN/config.json`` before anything of ours, so
with it ``AutoModelForCausalLM.from_pretrained(RUN)`` reaches this package's loader, which
loads the latest checkpoint, as it does for ``RUN/latest`` and ``RUN``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import migrations
from .atomic_io import atomic_symlink, recover_replaced, remove_entry
from .errors import DataError, check_header_keys
from .json_file import read_json_object

CHECKPOINTS = "checkpoints"
# Beside a checkpoint's weights: its step, training settings and what it trained on.
TRAINER_META = "trainer.json"
# What the trainers (today's and the two former ones) write into it.
TRAINER_META_KEYS = ("step", "train", "data", "processes", "initialised_from")
LATEST = "latest"
# The links of a run folder to its latest checkpoint (relative: the run folder may be moved),
# so that transformers' AutoModelForCausalLM and AutoTokenizer take the run folder itself.
LATEST_LINKS = {LATEST: None, "config.json": f"{LATEST}/config.json"}
# Linked when the latest checkpoint has them: a word run's model has no tokenizer.
TOKENIZER_LINKS = {name: f"{LATEST}/{name}" for name in ("tokenizer.json", "tokenizer_config.json")}
RUN_LINKS = {**LATEST_LINKS, **TOKENIZER_LINKS}


def step_directories(folder: Path) -> list[Path]:
    """The ``step_NNNNNNN`` checkpoints in ``folder``, oldest first; a replacement of one that
    a killed process left half done is finished first. Staging and retired directories
    start with a dot and never match."""
    if not folder.is_dir():
        return []
    for retired in folder.glob(".step_*.old"):
        recover_replaced(retired.with_name(retired.name[1:-len(".old")]))
    return sorted(p for p in folder.glob("step_*") if p.is_dir() and step_in_name(p) is not None)


def step_in_name(checkpoint: Path) -> int | None:
    """The step a checkpoint folder's name says (``step_0000006``: 6); None for another name."""
    digits = checkpoint.name[len("step_"):]
    return int(digits) if checkpoint.name.startswith("step_") and digits.isdigit() else None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The run's checkpoint of the highest step; a former word run's one checkpoint when the
    run has written none since."""
    run_dir = Path(run_dir)
    steps = step_directories(run_dir / CHECKPOINTS)
    return steps[-1] if steps else migrations.former_word_checkpoint(run_dir)


def model_folder(path: str | Path) -> Path:
    """The run's latest checkpoint when ``path`` is a run folder (its ``checkpoints``, or a
    former word run's one checkpoint, and no model of its own); else ``path``. A symbolic link
    (``RUN/latest``) is followed each time it is asked: the run replaces it as it goes on."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if (path / CHECKPOINTS).is_dir() or not (path / "config.json").exists():
        return latest_checkpoint(path) or path
    return path


def link_latest_checkpoint(run_dir: str | Path) -> None:
    """Point the run's ``LATEST_LINKS`` at its latest checkpoint, each in one rename. A copy
    of the run that followed the links (``shutil.copytree``) holds a folder and a file in
    their place: copies of the run's own, replaced by links again."""
    run_dir = Path(run_dir)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return
    for name, target in RUN_LINKS.items():
        if not (run_dir / name).is_symlink():
            remove_entry(run_dir / name)
        if name in TOKENIZER_LINKS and not (checkpoint / name).exists():
            remove_entry(run_dir / name)
            continue
        atomic_symlink(run_dir / name, target or str(checkpoint.relative_to(run_dir)))


def refuse_in_place_of_links(run_dir: str | Path) -> None:
    """A file or folder where a new run would keep a link to its latest checkpoint is the
    user's (``RUN/config.json`` of their own): refused before the run trains, not replaced.
    In a folder that holds a run already, they are that run's."""
    if latest_checkpoint(run_dir) is not None:
        return
    for name in RUN_LINKS:
        entry = Path(run_dir) / name
        if entry.exists() and not entry.is_symlink():
            raise DataError(f"{entry}: where a run links its latest checkpoint; move it out of the run folder")


def read_trainer_meta(checkpoint: str | Path) -> dict[str, Any]:
    """A checkpoint's metadata (``trainer.json``): the step, the training settings, the data
    and the processes it was trained with, and the checkpoint a warm-started run began from;
    any key besides these, a one-line DataError."""
    file = Path(checkpoint) / TRAINER_META
    meta = read_json_object(file, "checkpoint metadata")
    check_header_keys(meta, TRAINER_META_KEYS, file, "checkpoint metadata")
    return meta


def training_settings(path: str | Path) -> dict[str, Any]:
    """The training settings a checkpoint (or a run folder's latest) records, in today's
    spelling; none for an imported or hand-made model."""
    folder = Path(model_folder(path))
    if not (folder / TRAINER_META).is_file():
        return {}
    settings = read_trainer_meta(folder).get("train", {})
    return migrations.training_settings(settings, folder / TRAINER_META) if isinstance(settings, dict) else {}


def remove_stale_temporaries(run_dir: str | Path) -> list[Path]:
    """Remove the temporary files and folders (``.NAME.XXXX.tmp``, beside what they were to
    replace) that a killed run left in ``run_dir`` and its ``checkpoints``; returns them. A
    checkpoint's is the size of the model and its optimiser state. Only the run holding the
    folder's lock may call this: another run's temporaries are work in progress."""
    run_dir = Path(run_dir)
    stale = sorted([*run_dir.glob(".*.tmp"), *(run_dir / CHECKPOINTS).glob(".*.tmp")])
    for path in stale:
        remove_entry(path)
    return stale
