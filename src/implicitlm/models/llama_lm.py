"""Implicit / explicit Llama causal language model."""

from __future__ import annotations

from .configuration import ImplicitLlamaConfig
from .implicit_lm import ImplicitCausalLM
from .llama import LlamaStack, attention_dims


class ImplicitLlamaForCausalLM(ImplicitCausalLM):
    config_class = ImplicitLlamaConfig
    _no_split_modules = ["LlamaBlock"]

    def __init__(self, config: ImplicitLlamaConfig) -> None:
        super().__init__(config, LlamaStack(config), attention_dims(config).injection_size)
