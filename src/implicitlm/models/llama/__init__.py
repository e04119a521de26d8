"""The Llama family: its config (``configuration_llama.py``) and its blocks, stack and causal LM
(``modeling_llama.py``)."""

from .configuration_llama import ImplicitLlamaConfig
from .modeling_llama import ImplicitLlamaForCausalLM

__all__ = ["ImplicitLlamaConfig", "ImplicitLlamaForCausalLM"]
