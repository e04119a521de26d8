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
from .state_reading import reads_before_each_token


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
        gate, x, dt, B, C, conv = self._scan_inputs(hidden, injection, state, padding)
        y, ssm = ssd_scan(x, dt, decay_rates(self.A_log), B, C, chunk_size=d.chunk_size,
                          initial_state=None if state is None else state.ssm)
        y = y + x * self.D[:, None]
        out = self.out_proj(self.norm(y.reshape(batch, length, d.d_inner), gate))
        return out, Mamba2State(conv=conv, ssm=ssm)

    @property
    def query_size(self) -> int:
        """Width of a query that reads the SSM state (``read_state``): one C per group."""
        return self.dims.ngroups * self.dims.d_state

    @property
    def readout_size(self) -> int:
        return self.dims.d_inner

    def read_state(self, state: Mamba2State, query: torch.Tensor) -> torch.Tensor:
        """``query`` (b, query_size) read against the SSM state as the scan reads C against
        it (y = C h, per head and channel): (b, d_inner), in the state's dtype. What a learned
        initial guess knows of the tokens before the one it guesses beyond the last fixed point."""
        d = self.dims
        ssm = state.ssm
        heads = ssm.reshape(ssm.shape[0], d.ngroups, d.nheads // d.ngroups, d.headdim, d.d_state)
        read = torch.einsum("bghpn,bgn->bghp", heads, query.reshape(-1, d.ngroups, d.d_state).to(ssm.dtype))
        return read.reshape(ssm.shape[0], d.d_inner)

    def state_reader(
        self, hidden: torch.Tensor, injection: torch.Tensor | None = None, state: Mamba2State | None = None,
        padding: torch.Tensor | None = None,
    ):
        """queries (b, l, query_size) -> (b, l, d_inner): ``read_state`` of every token's query
        against the state before that token, the states these inputs leave (``forward``'s), at
        once (``state_reading``)."""
        d = self.dims
        batch, length, _ = hidden.shape
        _, x, dt, B, _, _ = self._scan_inputs(hidden, injection, state, padding)

        def read(queries: torch.Tensor) -> torch.Tensor:
            queries = queries.reshape(batch, length, d.ngroups, d.d_state).to(x.dtype)
            first = x.new_zeros(batch, d.d_inner) if state is None else self.read_state(state, queries[:, 0])
            reads = reads_before_each_token(ssd_scan, first.reshape(batch, d.nheads, d.headdim), x, dt,
                                            decay_rates(self.A_log), B, queries, d.chunk_size,
                                            None if state is None else state.ssm)
            return reads.reshape(batch, length, d.d_inner)

        return read

    def _scan_inputs(self, hidden: torch.Tensor, injection: torch.Tensor | None, state: Mamba2State | None,
                     padding: torch.Tensor | None):
        """The gate, the scan's x (b, l, heads, headdim), dt, B and C (b, l, groups, d_state),
        and the conv state after the tokens."""
        d = self.dims
        batch, length, _ = hidden.shape
        gate, xbc, dt = self._project(hidden, injection)
        if padding is not None:
            # A padding token feeds zeros to the conv, which moves leading padding in front
            # of the inputs the state holds, and has dt = 0 (no decay, no input): left padding
            # leaves the state as it found it.
            real = padding.to(xbc.dtype).unsqueeze(-1)
            xbc, dt = xbc * real, dt * real
        xbc, conv = causal_conv(xbc, None if state is None else state.conv, self.conv1d.weight, self.conv1d.bias,
                                padding)
        x, B, C = torch.split(F.silu(xbc), [d.d_inner, d.ngroups * d.d_state, d.ngroups * d.d_state], dim=-1)
        return (gate, x.reshape(batch, length, d.nheads, d.headdim), dt,
                B.reshape(batch, length, d.ngroups, d.d_state), C.reshape(batch, length, d.ngroups, d.d_state), conv)

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
