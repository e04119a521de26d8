"""Building models from option dicts and loading them from checkpoint directories."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from ..deq.options import check_known_keys
from .configuration import ImplicitMamba2Config
from .mamba2_lm import ImplicitMamba2ForCausalLM

MODEL_CLASSES = {ImplicitMamba2Config.model_type: ImplicitMamba2ForCausalLM}


class ModelLoadError(ValueError):
    """A directory that does not hold a model this package can load."""


def model_option_names() -> list[str]:
    return [n for n in inspect.signature(ImplicitMamba2Config.__init__).parameters if n not in ("self", "kwargs")]


def config_from_options(options: dict[str, Any]) -> ImplicitMamba2Config:
    """A config from user options; unknown names are errors (PretrainedConfig would keep them silently)."""
    check_known_keys(options, model_option_names(), "model option")
    return ImplicitMamba2Config(**options)


def load_model(path: str | Path) -> ImplicitMamba2ForCausalLM:
    """Load a saved model (config.json + model.safetensors); weights come from safetensors only."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path}: not a model directory (no config.json)")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"{config_file}: invalid JSON ({error.msg}, line {error.lineno})") from None
    if model_type not in MODEL_CLASSES:
        raise ModelLoadError(f"{config_file}: model_type {model_type!r} is not one of {sorted(MODEL_CLASSES)}")
    if not (path / "model.safetensors").is_file():
        raise ModelLoadError(f"{path}: no model.safetensors")
    try:
        return MODEL_CLASSES[model_type].from_pretrained(path, use_safetensors=True)
    except (OSError, RuntimeError, ValueError, SafetensorError) as error:
        raise ModelLoadError(f"{path}: cannot load weights ({str(error).splitlines()[0]})") from None
