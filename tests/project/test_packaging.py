"""What a package needs besides its code: type information for its users, its licence."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_says_it_is_typed_and_ships_the_marker():
    assert (ROOT / "src" / "implicitlm" / "py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["implicitlm"]


def test_the_licence_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    licence = (ROOT / "LICENSE").read_text()
    assert project["license"] == {"text": "MIT"}
    assert licence.startswith("MIT License\n") and "Copyright (c) the implicitlm authors" in licence
