"""Where a model's name points: a folder here, else a repository on the Hugging Face Hub
(``owner/name``), fetched as a folder here. A name that is neither is refused at once, naming
it, rather than handed to transformers, whose message about it names a missing ``config_class``
instead."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..core.atomic_io import recover_replaced
from ..core.errors import DataError, OptionError, quoted
from ..core.hub import hub_snapshot
from .errors import ModelLoadError

# A Hub repository as the Hub names one: owner/name, of letters, digits, "-", "_" and ".",
# neither part beginning or ending with "-" or ".".
HUB_ID = re.compile(r"(?:[A-Za-z0-9_]|[A-Za-z0-9_][\w.-]*[A-Za-z0-9_])/(?:[A-Za-z0-9_]|[A-Za-z0-9_][\w.-]*[A-Za-z0-9_])")


def local_model_path(path: Any, subfolder: str | None) -> Path | None:
    """``path`` (and its ``subfolder``) as a folder or file here, a checkpoint swap that a
    killed run left half done finished first; None for a Hub id (``owner/name``) that names
    nothing here. Anything else is a one-line error naming it."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise OptionError(f"pretrained_model_name_or_path must be a model folder or a Hub id (owner/name); "
                          f"got {quoted(path)}")
    name = os.fspath(path)
    if not name.strip():
        raise ModelLoadError(f"{name!r}: an empty path names no model folder")
    local = Path(name, subfolder or "")
    recover_replaced(local)
    if local.exists():
        return local
    if isinstance(path, str) and not local.is_absolute() and HUB_ID.fullmatch(name) and ".." not in name:
        return None
    raise ModelLoadError(f"{local if subfolder else name}: does not exist "
                         "(not a model folder here, nor a Hub id owner/name)")


def hub_model_folder(name: str, subfolder: str | None, options: dict[str, Any]) -> Path:
    """Hub repository ``name`` (its ``subfolder``) fetched into the hub's cache, a folder to load
    as any other: every check of a local one applies. ``options``: those of ``from_pretrained``,
    of which those that say what to fetch are taken out."""
    try:
        snapshot = hub_snapshot(name, "model", options)
    except DataError as error:
        raise ModelLoadError(str(error)) from None
    return Path(snapshot, subfolder or "")
