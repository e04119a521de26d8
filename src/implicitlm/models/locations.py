"""Where a model's name points: a folder here, else a repository on the Hugging Face Hub
(``owner/name``). A name that is neither is refused at once, naming it, rather than handed to
transformers, whose message about it names a missing ``config_class`` instead."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from ..core.atomic_io import recover_replaced
from ..core.errors import OptionError, first_line, quoted
from .errors import ModelLoadError
from .families import BY_MODEL_TYPE

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


def hub_model_class(cls: type, name: str, options: dict[str, Any]) -> type:
    """The class that loads Hub repository ``name``, from the model_type of its config.json: the
    family it names (the base class names no config class for transformers to read), which a
    family's ``cls`` must be. ``options``: those of ``from_pretrained`` (revision, token, ...)."""
    try:
        values, _ = PretrainedConfig.get_config_dict(name, **options)
    except Exception as error:  # the Hub client and transformers fail in many types
        raise ModelLoadError(f"{name}: not a folder here, and no model config from the Hub ({first_line(error)})") from None
    model_type = values.get("model_type")
    if model_type not in BY_MODEL_TYPE:
        raise ModelLoadError(f"{name}: config.json's model_type {quoted(model_type)} is not one of {sorted(BY_MODEL_TYPE)}")
    family_class = BY_MODEL_TYPE[model_type].model_class
    if getattr(cls, "config_class", None) not in (None, family_class.config_class):
        raise ModelLoadError(f"{name}: a model of type {model_type}, not {cls.config_class.model_type}")
    return family_class
