"""What a transformers ``LlamaForCausalLM`` checkpoint's config and weight names become in this family."""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig

from ..source_options import refuse, shared_options

# transformers' parameter prefixes -> ours; the layers' own names are the same in both.
LLAMA_PREFIXES = {
    "model.embed_tokens.": "embeddings.",
    "model.layers.": "stack.layers.",
    "model.norm.": "stack.norm_f.",
}


def llama_options(config: LlamaConfig) -> dict[str, Any]:
    rope = config.rope_parameters or {}
    refuse(config.attention_bias or config.mlp_bias, "attention_bias / mlp_bias (biases)")
    refuse(config.hidden_act != "silu", f"hidden_act={config.hidden_act!r} (only silu)")
    head_dim, rope_type = config.head_dim, rope.get("rope_type", "default")
    refuse(head_dim * config.num_attention_heads != config.hidden_size, f"head_dim={head_dim} (not hidden / heads)")
    refuse(rope_type != "default", f"rope_type={rope_type!r} (only the default RoPE)")
    return dict(
        shared_options(config),
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size,
        rope_theta=rope["rope_theta"],
        layer_norm_epsilon=config.rms_norm_eps,
    )
