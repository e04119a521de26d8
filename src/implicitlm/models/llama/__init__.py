"""The Llama family: its config (``configuration_llama.py``) and its blocks, stack and causal LM
(``modeling_llama.py``) and what a
transformers checkpoint of it maps onto (``source_llama.py``); its row is in ``models/families.py``."""

from .configuration_llama import ImplicitLlamaConfig
from .modeling_llama import ImplicitLlamaForCausalLM
from .source_llama import LLAMA_PREFIXES, llama_options

__all__ = ["LLAMA_PREFIXES", "ImplicitLlamaConfig", "ImplicitLlamaForCausalLM", "llama_options"]
