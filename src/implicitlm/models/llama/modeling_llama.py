"""Llama blocks, the Llama stack f(z, u) = RMSNorm(Block_N(... Block_1(z, u) ..., u)) and the
implicit / explicit Llama causal language model ``ImplicitLlamaForCausalLM``."""

from __future__ import annotations

import torch
from torch import nn

from ...layers import RMSNorm, SwiGLUMLP
from ...layers.attention import AttentionDims, CausalSelfAttention, KVCache
from ..implicit_lm import ImplicitCausalLM
from .configuration_llama import ImplicitLlamaConfig


def attention_dims(config: ImplicitLlamaConfig) -> AttentionDims:
    return AttentionDims(
        hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads, rope_theta=config.rope_theta,
    )


class LlamaBlock(nn.Module):
    """Pre-norm residual block: z <- z + Attn(RMSNorm(z), u); z <- z + MLP(RMSNorm(z)).

    Only the attention sees the injection. Names as in transformers' LlamaDecoderLayer.
    """

    def __init__(self, config: ImplicitLlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.self_attn = CausalSelfAttention(attention_dims(config))
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size)
        # N(0, initializer_range) for every Linear, as transformers' Llama initialises them
        # (not torch's default); here, before the stack puts weight norm on these weights.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=config.initializer_range)

    @property
    def injection_size(self) -> int:
        return self.self_attn.dims.injection_size

    def first_projection(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The norm and projections through which the attention reads its input, [q, k, v] in
        the order it splits its injection: an imported implicit model's injection copies them."""
        attention = self.self_attn
        projection = torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
        return self.input_layernorm.weight, projection

    def initial_state(self, batch: int, device=None, dtype=None) -> KVCache:
        return self.self_attn.initial_state(batch, device, dtype)

    @property
    def readout_sizes(self) -> tuple[int, int]:
        """(query, readout) widths of ``read_state``."""
        attention = self.self_attn
        return attention.query_size, attention.readout_size

    def read_state(self, state: KVCache, query: torch.Tensor) -> torch.Tensor:
        return self.self_attn.read_state(state, query)

    def state_reader(self, z: torch.Tensor, injection: torch.Tensor | None, state: KVCache | None, padding=None):
        return self.self_attn.state_reader(self.input_layernorm(z), injection, state, padding)

    def forward(
        self, z: torch.Tensor, injection: torch.Tensor | None, state: KVCache | None, padding=None
    ) -> tuple[torch.Tensor, KVCache]:
        out, state = self.self_attn(self.input_layernorm(z), injection, state, padding)
        z = z + out
        return z + self.mlp(self.post_attention_layernorm(z)), state

    def step(
        self, z: torch.Tensor, injection: torch.Tensor | None, state: KVCache
    ) -> tuple[torch.Tensor, KVCache]:
        out, state = self.self_attn.step(self.input_layernorm(z), injection, state)
        z = z + out
        return z + self.mlp(self.post_attention_layernorm(z)), state


class ImplicitLlamaForCausalLM(ImplicitCausalLM):
    config_class = ImplicitLlamaConfig
    block_class = LlamaBlock
    _no_split_modules = ["LlamaBlock"]
