"""The Mamba2 family: its config (``configuration_mamba2.py``) and its blocks, stack and causal LM
(``modeling_mamba2.py``)."""

from .configuration_mamba2 import ImplicitMamba2Config
from .modeling_mamba2 import ImplicitMamba2ForCausalLM

__all__ = ["ImplicitMamba2Config", "ImplicitMamba2ForCausalLM"]
