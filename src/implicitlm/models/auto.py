"""Registration with transformers' Auto classes, so saved models load by their model_type."""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM

from .llama import ImplicitLlamaConfig, ImplicitLlamaForCausalLM
from .mamba import ImplicitMambaConfig, ImplicitMambaForCausalLM
from .mamba2 import ImplicitMamba2Config, ImplicitMamba2ForCausalLM


def register_auto_classes() -> None:
    for config_class, model_class in (
        (ImplicitMamba2Config, ImplicitMamba2ForCausalLM),
        (ImplicitLlamaConfig, ImplicitLlamaForCausalLM),
        (ImplicitMambaConfig, ImplicitMambaForCausalLM),
    ):
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        AutoModelForCausalLM.register(config_class, model_class, exist_ok=True)
