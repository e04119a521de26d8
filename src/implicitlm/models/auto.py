"""Registration with transformers' Auto classes, so saved models load by their model_type."""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM

from .families import FAMILIES


def register_auto_classes() -> None:
    for family in FAMILIES:
        AutoConfig.register(family.model_type, family.config_class, exist_ok=True)
        AutoModelForCausalLM.register(family.config_class, family.model_class, exist_ok=True)
