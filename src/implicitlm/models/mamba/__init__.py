"""The Mamba (Mamba1) family: its config (``configuration_mamba.py``) and its blocks, stack and causal LM
(``modeling_mamba.py``) and what a
transformers checkpoint of it maps onto (``source_mamba.py``); its row is in ``models/families.py``."""

from .configuration_mamba import ImplicitMambaConfig
from .modeling_mamba import ImplicitMambaForCausalLM
from .source_mamba import mamba_options

__all__ = ["ImplicitMambaConfig", "ImplicitMambaForCausalLM", "mamba_options"]
