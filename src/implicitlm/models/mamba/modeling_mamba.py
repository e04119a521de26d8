"""Mamba1 blocks, the Mamba1 stack f(z, u) = RMSNorm(Block_N(... Block_1(z, u) ..., u)) and the
implicit / explicit Mamba (Mamba1) causal language model ``ImplicitMambaForCausalLM``."""

from __future__ import annotations

from ...layers.mamba1 import Mamba1Dims, Mamba1Mixer
from ..implicit_lm import ImplicitCausalLM
from ..mixer_block import MixerBlock
from .configuration_mamba import ImplicitMambaConfig


def mamba1_dims(config: ImplicitMambaConfig) -> Mamba1Dims:
    return Mamba1Dims(
        d_model=config.hidden_size, dt_rank=config.time_step_rank, d_state=config.state_size,
        d_conv=config.conv_kernel, expand=config.expand, chunk_size=config.chunk_size,
    )


class Mamba1Block(MixerBlock):
    """Pre-norm residual block around a Mamba1 mixer (transformers' ``MambaBlock``)."""

    def __init__(self, config: ImplicitMambaConfig) -> None:
        mixer = Mamba1Mixer(mamba1_dims(config), dt_min=config.time_step_min, dt_max=config.time_step_max)
        super().__init__(config, mixer)


class ImplicitMambaForCausalLM(ImplicitCausalLM):
    config_class = ImplicitMambaConfig
    block_class = Mamba1Block
    _no_split_modules = ["Mamba1Block"]
