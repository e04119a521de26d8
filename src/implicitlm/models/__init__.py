"""Configs and models (explicit and implicit); they know no trainer or evaluation."""

from .auto import register_auto_classes
from .configuration import ImplicitLMConfig
from .errors import ModelLoadError
from .families import FAMILIES
from .implicit_lm import ImplicitCausalLM
from .llama import ImplicitLlamaConfig, ImplicitLlamaForCausalLM
from .loading import build_model, config_from_options, load_model, model_option_names
from .mamba import ImplicitMambaConfig, ImplicitMambaForCausalLM
from .mamba2 import ImplicitMamba2Config, ImplicitMamba2ForCausalLM
from .output import ImplicitLMOutput

register_auto_classes()

__all__ = [
    "FAMILIES",
    "ImplicitCausalLM",
    "ImplicitLMConfig",
    "ImplicitLMOutput",
    "ImplicitLlamaConfig",
    "ImplicitLlamaForCausalLM",
    "ImplicitMamba2Config",
    "ImplicitMamba2ForCausalLM",
    "ImplicitMambaConfig",
    "ImplicitMambaForCausalLM",
    "ModelLoadError",
    "build_model",
    "config_from_options",
    "load_model",
    "model_option_names",
]
