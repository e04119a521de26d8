"""Mamba2 mixer (pure PyTorch) with an optional input injection.

The injection ``u`` is added to the ``in_proj`` pre-activations, so in an implicit model
the gate, x, B, C and dt all depend on both the iterate z and the input x. The parallel
form (``forward``) and the one-token form (``step``) compute the same function; ``step``
is functional: it returns the next state and never writes the one it was given, which
is what the sequential fixed-point mode needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import OptionError
from .causal_conv import causal_conv, causal_conv_step
from .norms import GatedRMSNorm
from .ssd import ssd_scan, ssd_step
from .ssm_parameters import decay_rates, initial_dt_bias, ssm_state_dtype


@dataclass
class Mamba2State:
    """Recurrent state of one mixer: the last ``d_conv`` conv inputs and the SSM state."""

    conv: torch.Tensor  # (b, conv_dim, d_conv), in the model's dtype
    ssm: torch.Tensor  # (b, heads, headdim, d_state), in ssm_state_dtype: float32 at least


@dataclass(frozen=True)
class Mamba2Dims:
    d_model: int
    d_state: int = 128
    d_conv: int = 4
    expand: int = 2
    headdim: int = 64
    ngroups: int = 1
    chunk_size: int = 256

    def __post_init__(self) -> None:
        if self.d_inner % self.headdim:
            raise OptionError(f"expand*d_model={self.d_inner} is not a multiple of headdim={self.headdim}")
        if self.nheads % self.ngroups:
            raise OptionError(f"number of heads {self.nheads} is not a multiple of ngroups={self.ngroups}")

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def d_in_proj(self) -> int:
        """Width of in_proj's output, and so of the injection: [gate, x, B, C, dt]."""
        return 2 * self.d_inner + 2 * self.ngroups * self.d_state + self.nheads


class Mamba2Mixer(nn.Module):
    def __init__(
        self,
        dims: Mamba2Dims,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        a_init_range: tuple[float, float] = (1.0, 16.0),
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.dims = dims
        self.in_proj = nn.Linear(dims.d_model, dims.d_in_proj, bias=False)
        self.conv1d = nn.Conv1d(dims.conv_dim, dims.conv_dim, dims.d_conv, groups=dims.conv_dim, bias=True)
        self.dt_bias = nn.Parameter(initial_dt_bias(dims.nheads, dt_min, dt_max, dt_init_floor))
        self.A_log = nn.Parameter(torch.log(torch.empty(dims.nheads).uniform_(*a_init_range)))
        self.D = nn.Parameter(torch.ones(dims.nheads))
        self.norm = GatedRMSNorm(dims.d_inner, eps=norm_eps, group_size=dims.d_inner // dims.ngroups)
        self.out_proj = nn.Linear(dims.d_inner, dims.d_model, bias=False)

    def initial_state(self, batch: int, device=None, dtype=None) -> Mamba2State:
        d = self.dims
        return Mamba2State(
            conv=torch.zeros(batch, d.conv_dim, d.d_conv, device=device, dtype=dtype),
            ssm=torch.zeros(batch, d.nheads, d.headdim, d.d_state, device=device, dtype=ssm_state_dtype(dtype)),
        )

    def forward(
        self, hidden: torch.Tensor, injection: torch.Tensor | None = None, state: Mamba2State | None = None,
        padding: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Mamba2State]:
        """hidden: (b, l, d_model); injection: (b, l, d_in_proj) or None; state: the state
        before the first token (zeros when None); padding: (b, l) bool, True at real tokens,
        or None. Returns (output, state after the last token)."""
        d = self.dims
        batch, length, _ = hidden.shape
        conv_state, ssm_state = (None, None) if state is None else (state.conv, state.ssm)
        gate, xbc, dt = self._project(hidden, injection)
        if padding is not None:
            # A padding token feeds zeros to the conv, which moves leading padding in front
            # of the inputs the state holds, and has dt = 0 (no decay, no input): left padding
            # leaves the state as it found it.
            real = padding.to(xbc.dtype).unsqueeze(-1)
            xbc, dt = xbc * real, dt * real
        xbc, conv = causal_conv(xbc, conv_state, self.conv1d.weight, self.conv1d.bias, padding)
        xbc = F.silu(xbc)
        x, B, C = torch.split(xbc, [d.d_inner, d.ngroups * d.d_state, d.ngroups * d.d_state], dim=-1)
        x = x.reshape(batch, length, d.nheads, d.headdim)
        y, ssm = ssd_scan(
            x,
            dt,
            decay_rates(self.A_log),
            B.reshape(batch, length, d.ngroups, d.d_state),
            C.reshape(batch, length, d.ngroups, d.d_state),
            chunk_size=d.chunk_size,
            initial_state=ssm_state,
        )
        y = y + x * self.D[:, None]
        out = self.out_proj(self.norm(y.reshape(batch, length, d.d_inner), gate))
        return out, Mamba2State(conv=conv, ssm=ssm)

    def step(
        self, hidden: torch.Tensor, injection: torch.Tensor | None, state: Mamba2State
    ) -> tuple[torch.Tensor, Mamba2State]:
        """One token: hidden (b, d_model), injection (b, d_in_proj) or None. Returns (out, next state)."""
        d = self.dims
        batch = hidden.shape[0]
        gate, xbc, dt = self._project(hidden, injection)
        xbc, conv = causal_conv_step(xbc, state.conv, self.conv1d.weight, self.conv1d.bias)
        xbc = F.silu(xbc)
        x, B, C = torch.split(xbc, [d.d_inner, d.ngroups * d.d_state, d.ngroups * d.d_state], dim=-1)
        x = x.reshape(batch, d.nheads, d.headdim)
        y, ssm = ssd_step(
            state.ssm,
            x,
            dt,
            decay_rates(self.A_log),
            B.reshape(batch, d.ngroups, d.d_state),
            C.reshape(batch, d.ngroups, d.d_state),
        )
        y = y + x * self.D[:, None]
        out = self.out_proj(self.norm(y.reshape(batch, d.d_inner), gate))
        return out, Mamba2State(conv=conv, ssm=ssm)

    def _project(
        self, hidden: torch.Tensor, injection: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = self.dims
        zxbcdt = self.in_proj(hidden)
        if injection is not None:
            zxbcdt = zxbcdt + injection
        gate, xbc, dt = torch.split(zxbcdt, [d.d_inner, d.conv_dim, d.nheads], dim=-1)
        return gate, xbc, F.softplus(dt + self.dt_bias)
