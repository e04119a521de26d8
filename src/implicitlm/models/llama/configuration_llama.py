"""Configuration of the Llama family: ``ImplicitLlamaConfig``."""

from __future__ import annotations

from typing import Any

from ...core.schema import POSITIVE, at_least, option_error
from ...layers.mlp import swiglu_hidden_size
from ..configuration import WHAT, ImplicitLMConfig, set_arguments


class ImplicitLlamaConfig(ImplicitLMConfig):
    """Llama blocks (attention with RoPE + SwiGLU MLP); field names follow ``transformers.LlamaConfig``.

    ``num_key_value_heads`` None means one key/value head per query head (no grouping);
    ``intermediate_size`` None means the authors' floor(2 * 4 * hidden_size / 3). The head
    size is hidden_size // num_attention_heads.
    """

    model_type = "implicit_llama"
    FIELD_RULES = {
        "num_attention_heads": at_least(1), "num_key_value_heads": at_least(1), "intermediate_size": at_least(1),
        "rope_theta": POSITIVE,
    }
    FIELD_HELP = {
        "num_hidden_layers": "blocks in the stack",
        "num_attention_heads": "query heads",
        "num_key_value_heads": "key/value heads (null: one per query head)",
        "intermediate_size": "MLP width (null: floor(8 x hidden_size / 3))",
        "rope_theta": "RoPE base",
    }

    def __init__(
        self, num_hidden_layers: int = 12, num_attention_heads: int = 12, num_key_value_heads: int | None = None,
        intermediate_size: int | None = None, rope_theta: float = 5e5, **kwargs: Any,
    ) -> None:
        set_arguments(self, ImplicitLlamaConfig, locals())
        if num_key_value_heads is None:
            self.num_key_value_heads = num_attention_heads
        super().__init__(num_hidden_layers=num_hidden_layers, **kwargs)
        # Resolved after the shared fields are set: the default depends on hidden_size.
        if intermediate_size is None:
            intermediate_size = swiglu_hidden_size(self.hidden_size)
        self.intermediate_size = intermediate_size

    def check_consistency(self) -> None:
        heads, kv_heads, size = self.num_attention_heads, self.num_key_value_heads, self.hidden_size
        if size % heads or (size // heads) % 2:
            # RoPE rotates pairs of dimensions: a head's size must be even.
            expected = f"a divisor of hidden_size = {size} into heads of even size"
            raise option_error(WHAT, "num_attention_heads", expected, heads)
        if heads % kv_heads:
            raise option_error(WHAT, "num_key_value_heads", f"a divisor of num_attention_heads = {heads}", kv_heads)
