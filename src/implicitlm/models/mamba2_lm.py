"""Implicit / explicit Mamba2 causal language model."""

from __future__ import annotations

from .configuration import ImplicitMamba2Config
from .implicit_lm import ImplicitCausalLM
from .mamba2 import Mamba2Stack, mamba2_dims


class ImplicitMamba2ForCausalLM(ImplicitCausalLM):
    config_class = ImplicitMamba2Config
    _no_split_modules = ["Mamba2Block"]

    def __init__(self, config: ImplicitMamba2Config) -> None:
        super().__init__(config, Mamba2Stack(config), mamba2_dims(config).d_in_proj)
