"""The Mamba2 stack f(z, u) = RMSNorm(Block_N(... Block_1(z, u) ..., u)), parallel and one-token."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from ..layers import Mamba2Dims, Mamba2Mixer, Mamba2State, RMSNorm
from .configuration import ImplicitMamba2Config


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

    def forward(
        self, z: torch.Tensor, injection: torch.Tensor | None, state: Mamba2State | None
    ) -> tuple[torch.Tensor, Mamba2State]:
        out, state = self.mixer(self.norm(z), injection, state)
        return z + out, state

    def step(
        self, z: torch.Tensor, injection: torch.Tensor | None, state: Mamba2State
    ) -> tuple[torch.Tensor, Mamba2State]:
        out, state = self.mixer.step(self.norm(z), injection, state)
        return z + out, state


class Mamba2Stack(nn.Module):
    """The backbone map of the model; the same object serves explicit and implicit models."""

    def __init__(self, config: ImplicitMamba2Config) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Mamba2Block(config) for _ in range(config.num_hidden_layers))
        self.norm_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        _rescale_out_proj(self, config.num_hidden_layers)
        if config.implicit and config.weight_norm:
            _apply_weight_norm(self)

    def initial_state(self, batch: int, device=None, dtype=None) -> list[Mamba2State]:
        return [layer.mixer.initial_state(batch, device, dtype) for layer in self.layers]

    def forward(
        self,
        z: torch.Tensor,
        injection: torch.Tensor | None,
        states: list[Mamba2State] | None = None,
    ) -> tuple[torch.Tensor, list[Mamba2State]]:
        new_states = []
        for i, layer in enumerate(self.layers):
            z, state = layer(z, injection, None if states is None else states[i])
            new_states.append(state)
        return self.norm_f(z), new_states

    def step(
        self, z: torch.Tensor, injection: torch.Tensor | None, states: list[Mamba2State]
    ) -> tuple[torch.Tensor, list[Mamba2State]]:
        new_states = []
        for layer, state in zip(self.layers, states):
            z, state = layer.step(z, injection, state)
            new_states.append(state)
        return self.norm_f(z), new_states


def _rescale_out_proj(stack: nn.Module, num_layers: int) -> None:
    # GPT-2-style residual scaling (as mamba_ssm): keeps the residual stream's variance
    # independent of depth at initialisation.
    with torch.no_grad():
        for module in stack.modules():
            if isinstance(module, Mamba2Mixer):
                module.out_proj.weight.div_(num_layers**0.5)


def _apply_weight_norm(stack: nn.Module) -> None:
    # torch's parametrisation rather than torchdeq's weight norm: torchdeq caches the
    # normalised weight as a plain attribute that goes stale (and holds a freed graph)
    # unless reset after every optimiser step; the parametrisation recomputes it, once per
    # forward under ``parametrize.cached()``.
    for module in list(stack.modules()):
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            weight_norm(module, name="weight", dim=0)
