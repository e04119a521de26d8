"""The Mamba2 family: its config (``configuration_mamba2.py``) and its blocks, stack and causal LM
(``modeling_mamba2.py``) and what a
transformers checkpoint of it maps onto (``source_mamba2.py``); its row is in ``models/families.py``."""

from .configuration_mamba2 import ImplicitMamba2Config
from .modeling_mamba2 import ImplicitMamba2ForCausalLM
from .source_mamba2 import mamba2_options

__all__ = ["ImplicitMamba2Config", "ImplicitMamba2ForCausalLM", "mamba2_options"]
