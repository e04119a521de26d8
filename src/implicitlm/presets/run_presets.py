"""Run presets: JSON files of options by section ("model", "train", "implicit_model", ...), shipped
beside this module or given as a path."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from ..core.json_file import read_json_object
from ..core.schema import option_error

PACKAGE = "implicitlm.presets"

# A preset section holds a dict of options; its name ends with one of these ("implicit_model").
SECTIONS = ("model", "train", "eval", "corpus")


def preset_names() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in resources.files(PACKAGE).iterdir() if p.name.endswith(".json"))


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset by name (see ``preset_names``) or a JSON file path, as a dict. A shipped
    name wins over a file or folder of that name in the working directory (which once
    trained another task without a word): a path is meant when it is written as one
    (``./demo``, ``presets/demo``, ``demo.json``).

    A file that cannot be read, is not JSON or holds no JSON object raises a one-line
    ``DataError`` (a ValueError) naming it; a section that holds no object, an OptionError.
    """
    path = Path(name_or_path)
    if name_or_path in preset_names():
        source = resources.files(PACKAGE) / f"{name_or_path}.json"
    elif path.suffix == ".json" or path.exists():
        source = path
    else:
        raise ValueError(f"unknown preset '{name_or_path}' (presets: {', '.join(preset_names())}; or a .json file)")
    preset = read_json_object(source, "a preset")
    for name, section in preset.items():
        if name.endswith(SECTIONS) and not isinstance(section, dict):
            raise option_error(f"{source}: preset section", name, "a dict", section)
    return preset
