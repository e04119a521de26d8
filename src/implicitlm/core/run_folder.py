"""Where a training run keeps its checkpoints: ``RUN/checkpoints/step_NNNNNNN`` (a run of the
former word trainer: ``migrations.former_word_checkpoint``). Loading a model from a run
folder loads its latest checkpoint.

A run also keeps two relative symbolic links to its latest checkpoint, replaced in one rename
whenever it writes one: ``RUN/latest`` (the checkpoint folder) and ``RUN/config.json``
(``latest/config.json``). transformers reads ``RUN/config.json`` before anything of ours, so
with it ``AutoModelForCausalLM.from_pretrained(RUN)`` reaches this package's loader, which
loads the latest checkpoint, as it does for ``RUN/latest`` and ``RUN``.

A write into the run folder would go through those links into a checkpoint: a model is not
saved there (``refuse_model_target``), and what was written through them anyway (a tokenizer's
``save_pretrained``) is refused at load by the checkpoint's ``files.sha256``."""

from __future__ import annotations

import filecmp
import os
from pathlib import Path
from typing import Any

from . import migrations
from .atomic_io import atomic_symlink, recover_replaced, remove_entry
from .errors import DataError, OptionError, TargetExistsError, check_header_keys, quoted
from .file_digests import COVERED
from .json_file import read_json_object
from .schema import NON_NEGATIVE, Rule, at_least, check_field

CHECKPOINTS = "checkpoints"
# Beside a checkpoint's weights: its step, training settings and what it trained on.
TRAINER_META = "trainer.json"
# What the trainers (today's and the two former ones) write into it.
# "measured": what was measured of a checkpoint after training (lines its model card shows);
# the trainer writes none, a shipped checkpoint may carry them. "lineage": the stages of
# training its model went through before this run (a warm start's source, and that one's own),
# oldest first, each what ``STAGE_KEYS`` keep of that stage's metadata.
TRAINER_META_KEYS = ("step", "train", "data", "processes", "initialised_from", "measured", "lineage")
# A stage of a lineage: its checkpoint's step, training settings, processes and origin, and
# whether its model was implicit (a warm start may turn an explicit model implicit).
STAGE_KEYS = ("step", "train", "processes", "initialised_from", "implicit")
# What a card cannot tell a stage without.
STAGE_RECORDED = ("step", "train", "implicit")
# A record's strings are shown in a model card: one line each, so that none can start a
# section of its own there.
PRINTABLE_LINE = Rule("(one line of printable text)", lambda text: text.isprintable())
PRINTABLE_LINES = Rule("(each one line of printable text)", lambda lines: all(line.isprintable() for line in lines))
# Every key's type and range (``core.schema``), held on every read: a model card, a resume and
# a learned solver's save take the values as they are.
TRAINER_META_TYPES = {
    "step": int, "train": dict[str, Any], "data": dict[str, int | str] | None, "processes": int,
    "initialised_from": str, "measured": list[str], "lineage": list[dict[str, Any]], "implicit": bool,
}
TRAINER_META_RULES = {"step": NON_NEGATIVE, "processes": at_least(1), "initialised_from": PRINTABLE_LINE,
                      "measured": PRINTABLE_LINES}
LATEST = "latest"
# The links of a run folder to its latest checkpoint (relative: the run folder may be moved),
# so that transformers' AutoModelForCausalLM and AutoTokenizer take the run folder itself.
LATEST_LINKS = {LATEST: None, "config.json": f"{LATEST}/config.json"}
# Linked when the latest checkpoint has them: a word run's model has no tokenizer.
TOKENIZER_LINKS = {name: f"{LATEST}/{name}" for name in ("tokenizer.json", "tokenizer_config.json")}
RUN_LINKS = {**LATEST_LINKS, **TOKENIZER_LINKS}
# What a training run writes into its folder, a former word run's one checkpoint included.
RUN_ENTRIES = (
    "metrics.jsonl", "tensorboard", migrations.FORMER_WORD_CHECKPOINT, CHECKPOINTS, "lm_training.json", "lm_training.png",
)
# Beside a config.json, the files that make a folder a saved model.
MODEL_WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")


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
        if path.name == LATEST:
            check_run_links(path.parent)
        path = path.resolve()
    if (path / CHECKPOINTS).is_dir() or not (path / "config.json").exists():
        check_run_links(path)
        return latest_checkpoint(path) or path
    return path


def check_model_location(path: str | Path) -> None:
    """Refuse, in one line saying what is there instead, a ``path`` that holds no model to load:
    neither a model (or checkpoint) folder nor a run folder with a checkpoint. A check of the
    files alone, which the command line makes before it imports torch."""
    path = Path(path)
    recover_replaced(path)  # a swap of it that a killed run left half done, finished as the loader does
    if not path.exists():
        raise DataError(f"{path}: does not exist (not a model folder here, nor a Hub id owner/name)")
    if (path / "config.json").exists() or latest_checkpoint(path) is not None:
        return
    if not path.is_dir():
        raise DataError(f"{path}: a file, not a model directory (a checkpoint folder or a run folder)")
    runs = _runs_inside(path)
    if runs:
        raise DataError(f"{path}: {_holding(runs)}, not a model: give one of them")
    if (path / CHECKPOINTS).is_dir():
        raise DataError(f"{path}: a run folder without a checkpoint yet")
    raise DataError(f"{path}: {'an empty folder, ' if _is_empty(path) else ''}not a model directory (no config.json)")


def check_resume_target(out: str | Path) -> None:
    """Refuse a resume of ``out`` that finds no run there, saying what ``out`` is instead: a
    checkpoint inside a run, a folder holding runs, an empty folder, nothing. (A run folder
    whose checkpoints are missing is the trainer's to refuse, with what it found.)"""
    out = Path(out)
    if not out.exists():
        raise DataError(f"{out}: nothing to resume (no such folder)")
    if out.resolve().parent.name == CHECKPOINTS and step_in_name(out.resolve()) is not None:
        run = out.resolve().parent.parent
        raise DataError(f"{out}: a checkpoint inside the run {run}: resume the run folder (--out {run})")
    runs = _runs_inside(out) if out.is_dir() and latest_checkpoint(out) is None else []
    if runs:
        raise DataError(f"{out}: {_holding(runs)}, not a run itself: resume one of them")
    if out.is_dir() and _is_empty(out):
        raise DataError(f"{out}: an empty folder: nothing to resume")


def _runs_inside(folder: Path) -> list[str]:
    """The names of ``folder``'s subfolders that are runs or models (a demo's output holds its runs)."""
    return sorted(entry.name for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith(".")
                  and (latest_checkpoint(entry) is not None or (entry / "config.json").exists()))


def _holding(runs: list[str]) -> str:
    names = [f"{name}/" for name in runs]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
    demo = " (a demo's output folder)" if {"explicit", "implicit"} <= set(runs) else ""
    return f"holds the run{'s' * (len(names) > 1)} {listed}{demo}"


def _is_empty(folder: Path) -> bool:
    return next(folder.iterdir(), None) is None


def check_run_links(run_dir: Path) -> None:
    """transformers' Auto classes follow a run folder's links (``AutoTokenizer`` reads
    ``RUN/tokenizer.json``) where this package reads the run's newest checkpoint: a link
    retargeted out of the run's checkpoints (to another run's) would pair the run's model with
    another's tokenizer. A link to an older checkpoint of its own is the run between writing a
    checkpoint and relinking; one that leads nowhere is read by no one."""
    own = (run_dir / CHECKPOINTS).resolve()
    if not own.is_dir():
        return
    for name in RUN_LINKS:
        link = run_dir / name
        if link.is_symlink() and link.exists() and own not in link.resolve().parents:
            raise DataError(f"{link}: links to {link.resolve()}, outside the run's own checkpoints ({own}); "
                            f"remove the link (the run makes it again at its next checkpoint), or load that checkpoint")


def link_latest_checkpoint(run_dir: str | Path) -> None:
    """Point the run's ``RUN_LINKS`` at its latest checkpoint, each in one rename. A copy
    of the run that followed the links (``shutil.copytree``) holds a folder and files in
    their place: copies of its checkpoints' own, replaced by links again; anything else
    there is the user's, refused (``refuse_in_place_of_links``) and kept."""
    run_dir = Path(run_dir)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return
    refuse_in_place_of_links(run_dir)
    for name, target in RUN_LINKS.items():
        if not (run_dir / name).is_symlink():
            remove_entry(run_dir / name)
        if name in TOKENIZER_LINKS and not (checkpoint / name).exists():
            remove_entry(run_dir / name)
            continue
        atomic_symlink(run_dir / name, target or str(checkpoint.relative_to(run_dir)))


def refuse_in_place_of_links(run_dir: str | Path) -> None:
    """A file or folder where a run keeps a link to its latest checkpoint is the user's
    (``RUN/config.json`` of their own): refused before the run trains, not replaced. Beside
    a run's checkpoints, only a copy of one of theirs (a copy of the run that followed its
    links) is the run's own."""
    run_dir = Path(run_dir)
    checkpoints = [*step_directories(run_dir / CHECKPOINTS), *filter(None, [latest_checkpoint(run_dir)])]
    for name in RUN_LINKS:
        entry = run_dir / name
        if entry.is_symlink() or not entry.exists():
            continue
        if not any(same_content(entry, checkpoint if name == LATEST else checkpoint / name) for checkpoint in checkpoints):
            of = "one of its checkpoints" if name == LATEST else f"the {name} of one of its checkpoints"
            copy = f", and not a copy of {of}" if checkpoints else ""
            raise DataError(f"{entry}: where a run links its latest checkpoint{copy}; move it out of the run folder")


def same_content(copy: Path, original: Path) -> bool:
    """Whether ``copy`` holds what ``original`` does: the same bytes, or (folders) the same
    names, each of the same content."""
    if copy.is_dir() and not copy.is_symlink():
        names = sorted(entry.name for entry in copy.iterdir())
        return original.is_dir() and names == sorted(entry.name for entry in original.iterdir()) \
            and all(same_content(copy / name, original / name) for name in names)
    return copy.is_file() and original.is_file() and filecmp.cmp(copy, original, shallow=False)


def refuse_model_target(folder: str | os.PathLike) -> None:
    """Where ``save_pretrained`` may save a model: not over a file (transformers would log it
    and save nothing); not in a training run's folder, whose config and tokenizer link into
    its newest checkpoint (the save would change them behind the checkpoint's digests), nor in
    one of its checkpoints or their folder; not through a symbolic link of a folder's own, in place of a file the save writes."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise TargetExistsError(f"{folder}: is a file; save_pretrained writes a folder there")
    run = folder.parent if folder.is_symlink() and folder.name == LATEST else folder
    if step_directories(run / CHECKPOINTS) or (run / LATEST).is_symlink():
        raise TargetExistsError(f"{run}: a training run's folder (its config and tokenizer link into its newest "
                                "checkpoint); save the model into a folder of its own")
    # Resolved: a link to a run's checkpoint is the checkpoint. Its weights, optimiser state
    # and trainer.json are one step of a run; another model's files there would be resumed.
    where = folder.resolve()
    if run_checkpoint(where) or step_directories(where):
        raise TargetExistsError(f"{folder}: a training run's checkpoint{'s' if step_directories(where) else ''} "
                                f"({where}); save the model into a folder of its own")
    written = [entry for entry in folder.iterdir() if entry.is_symlink()
               and (entry.name in COVERED or entry.suffix in (".safetensors", ".sha256"))] if folder.is_dir() else []
    if written:
        raise TargetExistsError(f"{written[0]}: a symbolic link, which save_pretrained would write through (into "
                                f"{written[0].resolve()}); save the model into a folder of its own")


def run_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` is (by its place) one of a training run's checkpoints."""
    return folder.parent.name == CHECKPOINTS and step_in_name(folder) is not None


def saved_work(folder: Path) -> str | None:
    """What ``folder`` is, as a message says it, when it is a model's or a training run's: one
    of a run's checkpoints, the folder of them, or a saved model (a config beside its weights; a
    run folder links its newest checkpoint's config, and holds no weights); else None."""
    if run_checkpoint(folder):
        return "a training run's checkpoint"
    if folder.name == CHECKPOINTS and any(step_in_name(step) is not None for step in folder.glob("step_*")):
        return "a training run's checkpoints"
    config = folder / "config.json"
    if config.is_file() and not config.is_symlink() and any(next(folder.glob(weights), None) for weights in MODEL_WEIGHTS):
        return "a saved model"
    return None


def refuse_saved_work(target: str | os.PathLike) -> None:
    """Where no writer writes: inside a saved model or a training run's checkpoints (an
    evaluation's record there would be taken for part of the model, or pruned with the
    checkpoint), in place of a run's checkpoint, or of an entry of a run's own (its log, its
    links). A saved model itself is a target for writers of a model's parts (a tokenizer, a
    model), which say whether they take it."""
    target = Path(os.path.abspath(target))
    folder = target.parent.resolve()  # a link on the way (RUN/latest) leads where the files land
    for inside in (folder, *folder.parents):
        what = saved_work(inside)
        if what is not None:
            raise TargetExistsError(f"{target}: inside {what} ({inside}); write it into a folder of its own")
    what = saved_work(target)
    if what is not None and what != "a saved model":
        raise TargetExistsError(f"{target}: {what}; write into a folder of its own")
    # A former word run's one checkpoint is a model with its training record; a model saved
    # into a folder named "checkpoint" is no run's.
    former = folder / migrations.FORMER_WORD_CHECKPOINT
    run = saved_work(folder / CHECKPOINTS) is not None or (folder / LATEST).is_symlink() \
        or (saved_work(former) is not None and (former / TRAINER_META).is_file())
    if run and target.name in (*RUN_ENTRIES, *RUN_LINKS):
        raise TargetExistsError(f"{target}: a training run's own {target.name}; write into a folder of its own")


def read_trainer_meta(checkpoint: str | Path) -> dict[str, Any]:
    """A checkpoint's metadata (``trainer.json``): the step, the training settings, the data
    and the processes it was trained with, the checkpoint a warm-started run began from, the
    stages before it, and what was measured of it since;
    any key besides these, or one of another type, a one-line DataError naming the file and
    the key. The training settings come in today's spelling, an unknown one refused (every
    reader, not only a resume, would otherwise drop it)."""
    file = Path(checkpoint) / TRAINER_META
    meta = read_json_object(file, "checkpoint metadata")
    _check_meta(meta, TRAINER_META_KEYS, file, "checkpoint metadata")
    for number, stage in enumerate(meta.get("lineage", []), 1):
        what = f"stage {number} of the lineage"
        _check_meta(stage, STAGE_KEYS, file, what)
        missing = [key for key in STAGE_RECORDED if key not in stage]
        if missing:
            raise DataError(f"{file}: {what} has no {quoted(missing[0])}")
    return meta


def _check_meta(meta: dict[str, Any], known: tuple[str, ...], file: Path, what: str) -> None:
    """``meta``'s keys among ``known``, each of its type; its training settings in today's spelling."""
    check_header_keys(meta, known, file, what)
    for key, value in meta.items():
        try:
            check_field(what, key, value, TRAINER_META_TYPES[key], TRAINER_META_RULES.get(key))
        except OptionError as error:
            raise DataError(f"{file}: {error}") from None
    if "train" in meta:
        meta["train"] = migrations.training_settings(meta["train"], file)


def training_settings(path: str | Path) -> dict[str, Any]:
    """The training settings a checkpoint (or a run folder's latest) records, in today's
    spelling; none for an imported or hand-made model."""
    folder = Path(model_folder(path))
    if not (folder / TRAINER_META).is_file():
        return {}
    settings = read_trainer_meta(folder).get("train", {})
    return settings if isinstance(settings, dict) else {}


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
