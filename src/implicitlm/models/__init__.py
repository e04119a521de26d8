"""Configs and models (explicit and implicit); they know no trainer or evaluation."""

from .configuration import ImplicitMamba2Config
from .loading import ModelLoadError, config_from_options, load_model
from .mamba2_lm import ImplicitMamba2ForCausalLM
from .output import ImplicitLMOutput

__all__ = [
    "ImplicitLMOutput",
    "ImplicitMamba2Config",
    "ImplicitMamba2ForCausalLM",
    "ModelLoadError",
    "config_from_options",
    "load_model",
]
