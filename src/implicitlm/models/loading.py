"""Building models from option dicts and loading them from checkpoint directories."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from ..deq.options import OptionError, check_known_keys
from .configuration import ImplicitLlamaConfig, ImplicitLMConfig, ImplicitMamba2Config, ImplicitMambaConfig
from .implicit_lm import ImplicitCausalLM
from .llama_lm import ImplicitLlamaForCausalLM
from .mamba1_lm import ImplicitMambaForCausalLM
from .mamba2_lm import ImplicitMamba2ForCausalLM

# The ``architecture`` model option names the backbone family.
CONFIG_CLASSES: dict[str, type[ImplicitLMConfig]] = {
    "mamba2": ImplicitMamba2Config,
    "llama": ImplicitLlamaConfig,
    "mamba": ImplicitMambaConfig,
}
MODEL_CLASSES: dict[str, type[ImplicitCausalLM]] = {
    ImplicitMamba2Config.model_type: ImplicitMamba2ForCausalLM,
    ImplicitLlamaConfig.model_type: ImplicitLlamaForCausalLM,
    ImplicitMambaConfig.model_type: ImplicitMambaForCausalLM,
}


class ModelLoadError(ValueError):
    """A directory that does not hold a model this package can load."""


def model_option_names(architecture: str = "mamba2") -> list[str]:
    """Every option ``config_from_options`` accepts for that architecture, ``architecture`` included."""
    names = ["architecture"]
    # The family's own fields, then those it passes on to the shared base class.
    for cls in _config_class(architecture).__mro__:
        if issubclass(cls, ImplicitLMConfig):
            names += [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "kwargs")]
    return list(dict.fromkeys(names))


def config_from_options(options: dict[str, Any]) -> ImplicitLMConfig:
    """A config from user options; ``architecture`` ("mamba2", the default, "llama" or
    "mamba", i.e. Mamba1) picks the family. Unknown names are errors (PretrainedConfig
    would keep them silently)."""
    architecture = options.get("architecture", "mamba2")
    check_known_keys(options, model_option_names(architecture), "model option")
    return _config_class(architecture)(**{k: v for k, v in options.items() if k != "architecture"})


def build_model(config: ImplicitLMConfig) -> ImplicitCausalLM:
    """A freshly initialised model of the config's family."""
    return MODEL_CLASSES[config.model_type](config)


def load_model(path: str | Path) -> ImplicitCausalLM:
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


def _config_class(architecture: str) -> type[ImplicitLMConfig]:
    if architecture not in CONFIG_CLASSES:
        raise OptionError(f"architecture must be one of {', '.join(CONFIG_CLASSES)}; got {architecture!r}")
    return CONFIG_CLASSES[architecture]
