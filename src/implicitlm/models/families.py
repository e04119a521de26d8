"""The backbone families, one row each, the first the default. A family is its folder (config,
blocks, model, and what a transformers checkpoint of it maps onto) and its row here: the Auto
classes, loading, ``--model architecture=`` and its help, ``models import`` and the package's
exports all read this table (docs/development/adding-a-family.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from transformers import LlamaForCausalLM, Mamba2ForCausalLM, MambaForCausalLM, PretrainedConfig, PreTrainedModel

from .configuration import ImplicitLMConfig
from .implicit_lm import ImplicitCausalLM
from .llama import LLAMA_PREFIXES, ImplicitLlamaConfig, ImplicitLlamaForCausalLM, llama_options
from .mamba import ImplicitMambaConfig, ImplicitMambaForCausalLM, mamba_options
from .mamba2 import ImplicitMamba2Config, ImplicitMamba2ForCausalLM, mamba2_options
from .source_options import MAMBA_PREFIXES


@dataclass(frozen=True)
class Family:
    """``architecture``: the name ``--model architecture=`` takes. ``source_class``: the
    explicit transformers model whose checkpoints import into this family;
    ``source_options``: its config as this family's options (refusing what is not
    implemented here); ``source_prefixes``: its weights' name prefixes -> ours."""

    architecture: str
    config_class: type[ImplicitLMConfig]
    model_class: type[ImplicitCausalLM]
    source_class: type[PreTrainedModel]
    source_options: Callable[[PretrainedConfig], dict[str, Any]]
    source_prefixes: dict[str, str]

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def source_model_type(self) -> str:
        return self.source_class.config_class.model_type


FAMILIES = (
    Family("mamba2", ImplicitMamba2Config, ImplicitMamba2ForCausalLM, Mamba2ForCausalLM, mamba2_options, MAMBA_PREFIXES),
    Family("llama", ImplicitLlamaConfig, ImplicitLlamaForCausalLM, LlamaForCausalLM, llama_options, LLAMA_PREFIXES),
    Family("mamba", ImplicitMambaConfig, ImplicitMambaForCausalLM, MambaForCausalLM, mamba_options, MAMBA_PREFIXES),
)
DEFAULT_ARCHITECTURE = FAMILIES[0].architecture
BY_ARCHITECTURE = {family.architecture: family for family in FAMILIES}
BY_MODEL_TYPE = {family.model_type: family for family in FAMILIES}
BY_SOURCE_MODEL_TYPE = {family.source_model_type: family for family in FAMILIES}


def architecture_choices() -> str:
    """The families as ``--model architecture=`` takes them, for help texts: "mamba2 (default), llama or mamba"."""
    names = [f"{family.architecture} (default)" if family is FAMILIES[0] else family.architecture for family in FAMILIES]
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
