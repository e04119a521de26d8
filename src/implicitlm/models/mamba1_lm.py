"""Implicit / explicit Mamba1 causal language model."""

from __future__ import annotations

from .configuration import ImplicitMambaConfig
from .implicit_lm import ImplicitCausalLM
from .mamba1 import Mamba1Stack, mamba1_dims


class ImplicitMambaForCausalLM(ImplicitCausalLM):
    config_class = ImplicitMambaConfig
    _no_split_modules = ["Mamba1Block"]

    def __init__(self, config: ImplicitMambaConfig) -> None:
        super().__init__(config, Mamba1Stack(config), mamba1_dims(config).d_in_proj)
