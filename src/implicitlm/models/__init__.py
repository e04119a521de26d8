"""Configs and models (explicit and implicit); they know no trainer or evaluation.

Each family's config and model class is exported by its name (``implicitlm.models.ImplicitLlamaConfig``),
read from the families' table, so that a new family is its folder and its row (``families.py``)."""

from .auto import register_auto_classes
from .configuration import ImplicitLMConfig
from .errors import ModelLoadError
from .families import FAMILIES
from .implicit_lm import ImplicitCausalLM
from .loading import build_model, config_from_options, load_model, load_pretrained, model_option_names
from .output import ImplicitLMOutput

FAMILY_CLASSES = {cls.__name__: cls for family in FAMILIES for cls in (family.config_class, family.model_class)}
globals().update(FAMILY_CLASSES)

register_auto_classes()
# Given to the class here, not imported by it: the loader reads the families' table, built on it.
ImplicitCausalLM.pretrained_loader = staticmethod(load_pretrained)

__all__ = [
    "FAMILIES",
    "FAMILY_CLASSES",
    "ImplicitCausalLM",
    "ImplicitLMConfig",
    "ImplicitLMOutput",
    "ModelLoadError",
    "build_model",
    "config_from_options",
    "load_model",
    "model_option_names",
    *FAMILY_CLASSES,
]
