"""Presets shipped with the package, as JSON files beside this module."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any


def preset_names() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset by name (see ``preset_names``) or a JSON file path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        source = path
    elif name_or_path in preset_names():
        source = resources.files(__name__) / f"{name_or_path}.json"
    else:
        raise ValueError(f"unknown preset '{name_or_path}' (presets: {', '.join(preset_names())}; or a .json file)")
    try:
        return json.loads(source.read_text())
    except OSError as error:
        raise ValueError(f"{source}: cannot read ({error.strerror})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}: invalid JSON ({error.msg} at line {error.lineno})") from None
