"""The Mamba (Mamba1) family: its config (``configuration_mamba.py``) and its blocks, stack and causal LM
(``modeling_mamba.py``)."""

from .configuration_mamba import ImplicitMambaConfig
from .modeling_mamba import ImplicitMambaForCausalLM

__all__ = ["ImplicitMambaConfig", "ImplicitMambaForCausalLM"]
