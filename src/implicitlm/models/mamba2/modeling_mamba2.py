"""Mamba2 blocks, the Mamba2 stack f(z, u) = RMSNorm(Block_N(... Block_1(z, u) ..., u)) and the
implicit / explicit Mamba2 causal language model ``ImplicitMamba2ForCausalLM``."""

from __future__ import annotations

from ...layers.mamba2 import Mamba2Dims, Mamba2Mixer
from ..implicit_lm import ImplicitCausalLM
from ..mixer_block import MixerBlock
from .configuration_mamba2 import ImplicitMamba2Config


def mamba2_dims(config: ImplicitMamba2Config) -> Mamba2Dims:
    return Mamba2Dims(
        d_model=config.hidden_size, d_state=config.state_size, d_conv=config.conv_kernel, expand=config.expand,
        headdim=config.head_dim, ngroups=config.n_groups, chunk_size=config.chunk_size,
    )


class Mamba2Block(MixerBlock):
    """Pre-norm residual block around a Mamba2 mixer."""

    def __init__(self, config: ImplicitMamba2Config) -> None:
        mixer = Mamba2Mixer(
            mamba2_dims(config), dt_min=config.time_step_min, dt_max=config.time_step_max,
            a_init_range=config.a_init_range, norm_eps=config.layer_norm_epsilon,
        )
        super().__init__(config, mixer)


class ImplicitMamba2ForCausalLM(ImplicitCausalLM):
    config_class = ImplicitMamba2Config
    block_class = Mamba2Block
    _no_split_modules = ["Mamba2Block"]
