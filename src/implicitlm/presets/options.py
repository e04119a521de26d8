"""The one merge rule of a run's options, and model options from a name or a file.

Every run's options come from up to four places, each later one winning key by key: a model
preset (the paper's sizes, ``model_presets``), the run preset's shared section (``model`` or
``train``), its section for the kind of model (``implicit_model``, ``explicit_train``, ...),
and the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import OptionError
from ..core.json_file import read_json_object
from .model_presets import model_preset
from .run_presets import KINDS, check_sections, checkpoint_preset

PRESET_PREFIX = "preset:"


def merged_options(
    preset: dict[str, Any], section: str, kind: str, command_line: dict[str, Any], base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``base``, then ``preset[section]``, then ``preset[f"{kind}_{section}"]``, then ``command_line``."""
    if kind not in KINDS:
        raise OptionError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    return {**(base or {}), **preset.get(section, {}), **preset.get(f"{kind}_{section}", {}), **command_line}


def model_kind(preset: dict[str, Any], command_line: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    """"implicit" or "explicit": what the merged options say of ``implicit`` (implicit unless told)."""
    shared = {**(base or {}), **preset.get("model", {}), **command_line}
    return "implicit" if shared.get("implicit", True) else "explicit"


def check_model_options_name(spec: str) -> None:
    """Refuse a model preset's name that names none (a JSON file or folder is checked when
    read), before anything is loaded."""
    if not (spec.endswith(".json") or Path(spec).is_dir()):
        model_preset(spec.removeprefix(PRESET_PREFIX))


def model_options_from(spec: str) -> dict[str, Any]:
    """Model options from a model preset's name (``mamba2-130m-bounded``, or ``preset:`` and the
    name), a JSON file (its "model" section if it has one, else the whole object) or a
    checkpoint (or run folder) of this package."""
    if spec.endswith(".json"):
        options = read_json_object(Path(spec), "a preset")
        # A file of sections is checked as every preset is; one of bare model options is the options.
        return check_sections(options, spec)["model"] if "model" in options else options
    if Path(spec).is_dir():
        return checkpoint_preset(spec)["model"]
    return model_preset(spec.removeprefix(PRESET_PREFIX))
