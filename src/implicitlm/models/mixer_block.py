"""The pre-norm residual block of the Mamba families: z <- z + Mixer(RMSNorm(z), u).

Mamba1 and Mamba2 blocks differ only in their mixer; names as transformers' blocks
(``norm``, ``mixer``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..layers import RMSNorm
from .configuration import ImplicitLMConfig


class MixerBlock(nn.Module):
    def __init__(self, config: ImplicitLMConfig, mixer: nn.Module) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mixer = mixer
        # GPT-2-style residual scaling (as mamba_ssm): keeps the residual stream's variance
        # independent of depth at initialisation.
        with torch.no_grad():
            self.mixer.out_proj.weight.div_(config.num_hidden_layers**0.5)

    @property
    def injection_size(self) -> int:
        return self.mixer.dims.d_in_proj

    def first_projection(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The norm and projection through which the block's mixer reads its input, which an
        imported implicit model's injection copies (``convert``)."""
        return self.norm.weight, self.mixer.in_proj.weight

    def initial_state(self, batch: int, device=None, dtype=None) -> Any:
        return self.mixer.initial_state(batch, device, dtype)

    @property
    def readout_sizes(self) -> tuple[int, int]:
        """(query, readout) widths of ``read_state``."""
        return self.mixer.query_size, self.mixer.readout_size

    def read_state(self, state: Any, query: torch.Tensor) -> torch.Tensor:
        return self.mixer.read_state(state, query)

    def state_reader(self, z: torch.Tensor, injection: torch.Tensor | None, state: Any | None, padding=None):
        return self.mixer.state_reader(self.norm(z), injection, state, padding)

    def forward(
        self, z: torch.Tensor, injection: torch.Tensor | None, state: Any | None, padding=None
    ) -> tuple[torch.Tensor, Any]:
        out, state = self.mixer(self.norm(z), injection, state, padding)
        return z + out, state

    def step(self, z: torch.Tensor, injection: torch.Tensor | None, state: Any) -> tuple[torch.Tensor, Any]:
        out, state = self.mixer.step(self.norm(z), injection, state)
        return z + out, state
