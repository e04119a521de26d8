"""Run presets: options by section ("model", "train", "implicit_model", ...), from a JSON file
shipped beside this module or given as a path, a preset registered by name in this process, or
a checkpoint (or run folder), whose config and training settings start a new run alike."""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from ..core.json_file import read_json_object
from ..core.run_folder import model_folder, training_settings
from ..core.schema import OptionError, check_known_keys, option_error

PACKAGE = "implicitlm.presets"

# A preset section holds a dict of options: one of these, shared by both kinds of model, or
# one kind's own ("implicit_model", "explicit_train").
SECTIONS = ("model", "train", "eval", "corpus")
KINDS = ("implicit", "explicit")
SECTION_NAMES = (*SECTIONS, *(f"{kind}_{section}" for kind in KINDS for section in SECTIONS))


# Presets registered in this process by register_preset, by name.
_REGISTERED: dict[str, dict[str, Any]] = {}


def shipped_preset_names() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in resources.files(PACKAGE).iterdir() if p.name.endswith(".json"))


def preset_names() -> list[str]:
    """The shipped presets and those registered in this process."""
    return sorted({*shipped_preset_names(), *_REGISTERED})


def register_preset(name: str, preset: Mapping[str, Any]) -> None:
    """Make ``preset`` loadable by ``name`` in this process, as the shipped ones are (a copy:
    later changes to ``preset`` do not reach it). A shipped name is not replaced."""
    if name in shipped_preset_names():
        raise OptionError(f"'{name}' is a shipped preset; register yours under another name")
    _REGISTERED[name] = check_sections(copy.deepcopy(dict(preset)), f"preset '{name}'")


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset by name (see ``preset_names``), a JSON file path or a checkpoint (or run
    folder, see ``checkpoint_preset``), as a dict. A registered or shipped name wins over a
    file or folder of that name in the working directory (which once trained another task
    without a word): a path is meant when it is written as one (``./demo``, ``presets/demo``,
    ``demo.json``).

    A file that cannot be read, is not JSON or holds no JSON object raises a one-line
    ``DataError`` (a ValueError) naming it; a section that holds no object, an OptionError.
    """
    check_preset_name(name_or_path)
    path = Path(name_or_path)
    if name_or_path in _REGISTERED:
        return copy.deepcopy(_REGISTERED[name_or_path])
    if name_or_path in shipped_preset_names():
        source = resources.files(PACKAGE) / f"{name_or_path}.json"
    elif path.is_dir() and path.suffix != ".json":
        return checkpoint_preset(path)
    else:
        source = path
    return check_sections(read_json_object(source, "a preset"), str(source))


def check_preset_name(name_or_path: str) -> None:
    """Refuse what is neither a preset's name, a JSON file nor a folder, before anything is read."""
    path = Path(name_or_path)
    if name_or_path in preset_names() or path.suffix == ".json" or path.exists():
        return
    raise OptionError(
        f"unknown preset '{name_or_path}' (presets: {', '.join(preset_names())}; or a .json file or a checkpoint)"
    )


def checkpoint_preset(path: str | Path) -> dict[str, Any]:
    """A checkpoint's (or a run folder's latest) model options and training settings as a
    preset's "model" and "train" sections: a new run from them builds the same architecture
    and trains as that run did (the command line still has the last word). The config is
    checked as a loaded model's is: an unknown key is refused, not dropped."""
    from ..models.loading import saved_model_options  # here: checking a preset's name loads no torch

    folder = model_folder(path)
    preset = {"model": saved_model_options(folder)}
    settings = {k: v for k, v in training_settings(folder).items() if k != "task"}
    return {**preset, "train": settings} if settings else preset


def check_sections(preset: dict[str, Any], source: str) -> dict[str, Any]:
    """``preset``, every section of it one this package reads and a dict of options: a
    misspelt section would be ignored and its options left at their defaults (a far larger
    model than asked for)."""
    try:
        check_known_keys(preset, SECTION_NAMES, "preset section")
    except OptionError as error:
        raise OptionError(f"{source}: {error}") from None
    for name, section in preset.items():
        if not isinstance(section, dict):
            raise option_error(f"{source}: preset section", name, "a dict", section)
    return preset
