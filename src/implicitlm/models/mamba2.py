"""Mamba2 blocks and the Mamba2 stack f(z, u) = RMSNorm(Block_N(... Block_1(z, u) ..., u))."""

from __future__ import annotations

import torch
from torch import nn

from ..layers import Mamba2Dims, Mamba2Mixer, Mamba2State, RMSNorm
from .configuration import ImplicitMamba2Config
from .stack import BlockStack


def mamba2_dims(config: ImplicitMamba2Config) -> Mamba2Dims:
    return Mamba2Dims(
        d_model=config.hidden_size,
        d_state=config.state_size,
        d_conv=config.conv_kernel,
        expand=config.expand,
        headdim=config.head_dim,
        ngroups=config.n_groups,
        chunk_size=config.chunk_size,
    )


class Mamba2Block(nn.Module):
    """Pre-norm residual block: z <- z + Mixer(RMSNorm(z), u)."""

    def __init__(self, config: ImplicitMamba2Config) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mixer = Mamba2Mixer(
            mamba2_dims(config),
            dt_min=config.time_step_min,
            dt_max=config.time_step_max,
            a_init_range=config.a_init_range,
            norm_eps=config.layer_norm_epsilon,
        )
        # GPT-2-style residual scaling (as mamba_ssm): keeps the residual stream's variance
        # independent of depth at initialisation.
        with torch.no_grad():
            self.mixer.out_proj.weight.div_(config.num_hidden_layers**0.5)

    def initial_state(self, batch: int, device=None, dtype=None) -> Mamba2State:
        return self.mixer.initial_state(batch, device, dtype)

    def forward(
        self, z: torch.Tensor, injection: torch.Tensor | None, state: Mamba2State | None, padding=None
    ) -> tuple[torch.Tensor, Mamba2State]:
        out, state = self.mixer(self.norm(z), injection, state, padding)
        return z + out, state

    def step(
        self, z: torch.Tensor, injection: torch.Tensor | None, state: Mamba2State
    ) -> tuple[torch.Tensor, Mamba2State]:
        out, state = self.mixer.step(self.norm(z), injection, state)
        return z + out, state


class Mamba2Stack(BlockStack):
    def __init__(self, config: ImplicitMamba2Config) -> None:
        super().__init__([Mamba2Block(config) for _ in range(config.num_hidden_layers)], config)
