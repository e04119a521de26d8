"""Mamba1 mixer (pure PyTorch) with an optional input injection.

The function and parameter names are those of transformers' ``MambaMixer``: in_proj gives
[x, gate]; x goes through the causal depthwise conv and silu; x_proj reads a low-rank dt,
B and C off it, and dt_proj lifts dt to one step size per channel; then
y = scan(x) + D x, gated by silu(gate), and out_proj. The injection ``u`` is added to the
in_proj pre-activations, so in an implicit model x and the gate (and through x: dt, B and
C) depend on both the iterate z and the input x. The parallel form (``forward``) and the
one-token form (``step``) compute the same function; ``step`` is functional: it returns
the next state and never writes the one it was given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .causal_conv import causal_conv, causal_conv_step
from .selective_scan import selective_scan_chunked, selective_scan_step
from .ssm_parameters import decay_rates, initial_dt_bias, ssm_state_dtype
from .state_reading import reads_before_each_token


@dataclass
class Mamba1State:
    """Recurrent state of one mixer: the last ``d_conv`` conv inputs and the SSM state."""

    conv: torch.Tensor  # (b, d_inner, d_conv), in the model's dtype
    ssm: torch.Tensor  # (b, d_inner, d_state), in ssm_state_dtype: float32 at least


@dataclass(frozen=True)
class Mamba1Dims:
    d_model: int
    dt_rank: int
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    chunk_size: int = 4

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def d_in_proj(self) -> int:
        """Width of in_proj's output, and so of the injection: [x, gate]."""
        return 2 * self.d_inner


class Mamba1Mixer(nn.Module):
    def __init__(
        self, dims: Mamba1Dims, dt_min: float = 1e-3, dt_max: float = 0.1, dt_init_floor: float = 1e-4
    ) -> None:
        super().__init__()
        self.dims = dims
        self.in_proj = nn.Linear(dims.d_model, dims.d_in_proj, bias=False)
        self.conv1d = nn.Conv1d(dims.d_inner, dims.d_inner, dims.d_conv, groups=dims.d_inner, bias=True)
        self.x_proj = nn.Linear(dims.d_inner, dims.dt_rank + 2 * dims.d_state, bias=False)
        self.dt_proj = nn.Linear(dims.dt_rank, dims.d_inner, bias=True)
        # mamba_ssm's initialisation: dt_proj keeps the low-rank dt at unit scale, and its
        # bias puts the initial step sizes log-uniformly in [dt_min, dt_max].
        nn.init.uniform_(self.dt_proj.weight, -(dims.dt_rank**-0.5), dims.dt_rank**-0.5)
        with torch.no_grad():
            self.dt_proj.bias.copy_(initial_dt_bias(dims.d_inner, dt_min, dt_max, dt_init_floor))
        # S4D-real: A[:, n] = -(n + 1) in every channel.
        s4d_real = torch.arange(1, dims.d_state + 1, dtype=torch.float32).repeat(dims.d_inner, 1)
        self.A_log = nn.Parameter(torch.log(s4d_real))
        self.D = nn.Parameter(torch.ones(dims.d_inner))
        self.out_proj = nn.Linear(dims.d_inner, dims.d_model, bias=False)

    def initial_state(self, batch: int, device=None, dtype=None) -> Mamba1State:
        d = self.dims
        return Mamba1State(
            conv=torch.zeros(batch, d.d_inner, d.d_conv, device=device, dtype=dtype),
            ssm=torch.zeros(batch, d.d_inner, d.d_state, device=device, dtype=ssm_state_dtype(dtype)),
        )

    def forward(
        self, hidden: torch.Tensor, injection: torch.Tensor | None = None, state: Mamba1State | None = None,
        padding: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Mamba1State]:
        """hidden: (b, l, d_model); injection: (b, l, d_in_proj) or None; state: the state
        before the first token (zeros when None); padding: (b, l) bool, True at real tokens,
        or None. Returns (output, state after the last token)."""
        d = self.dims
        x, gate, dt, B, C, conv = self._scan_inputs(hidden, injection, state, padding)
        y, ssm = selective_scan_chunked(x, dt, decay_rates(self.A_log), B, C, d.chunk_size,
                                        None if state is None else state.ssm)
        return self._output(y, x, gate), Mamba1State(conv=conv, ssm=ssm)

    @property
    def query_size(self) -> int:
        """Width of a query that reads the SSM state (``read_state``): a C."""
        return self.dims.d_state

    @property
    def readout_size(self) -> int:
        return self.dims.d_inner

    def read_state(self, state: Mamba1State, query: torch.Tensor) -> torch.Tensor:
        """``query`` (b, d_state) read against the SSM state as the scan reads C against it
        (y = C h, per channel): (b, d_inner), in the state's dtype. What a learned initial
        guess knows of the tokens before the one it guesses beyond the last fixed point."""
        return torch.einsum("bdn,bn->bd", state.ssm, query.to(state.ssm.dtype))

    def state_reader(
        self, hidden: torch.Tensor, injection: torch.Tensor | None = None, state: Mamba1State | None = None,
        padding: torch.Tensor | None = None,
    ):
        """queries (b, l, d_state) -> (b, l, d_inner): ``read_state`` of every token's query
        against the state before that token, the states these inputs leave (``forward``'s), at
        once (``state_reading``)."""
        d = self.dims
        batch = hidden.shape[0]
        x, _, dt, B, _, _ = self._scan_inputs(hidden, injection, state, padding)

        def read(queries: torch.Tensor) -> torch.Tensor:
            queries = queries.to(x.dtype)
            first = x.new_zeros(batch, d.d_inner) if state is None else self.read_state(state, queries[:, 0])
            return reads_before_each_token(selective_scan_chunked, first, x, dt, decay_rates(self.A_log), B, queries,
                                           d.chunk_size, None if state is None else state.ssm)

        return read

    def _scan_inputs(self, hidden: torch.Tensor, injection: torch.Tensor | None, state: Mamba1State | None,
                     padding: torch.Tensor | None):
        """The scan's x (b, l, d_inner), the gate, dt, B and C, and the conv state after the tokens."""
        x, gate = self._project(hidden, injection)
        real = None if padding is None else padding.to(x.dtype).unsqueeze(-1)
        if real is not None:
            # A padding token feeds zeros to the conv, which moves leading padding in front
            # of the inputs the state holds, and has dt = 0 (no decay, no input): left padding
            # leaves the state as it found it.
            x = x * real
        x, conv = causal_conv(x, None if state is None else state.conv, self.conv1d.weight, self.conv1d.bias, padding)
        x = F.silu(x)
        dt, B, C = self._select(x)
        if real is not None:
            dt = dt * real
        return x, gate, dt, B, C, conv

    def step(
        self, hidden: torch.Tensor, injection: torch.Tensor | None, state: Mamba1State
    ) -> tuple[torch.Tensor, Mamba1State]:
        """One token: hidden (b, d_model), injection (b, d_in_proj) or None. Returns (out, next state)."""
        x, gate = self._project(hidden, injection)
        x, conv = causal_conv_step(x, state.conv, self.conv1d.weight, self.conv1d.bias)
        x = F.silu(x)
        dt, B, C = self._select(x)
        y, ssm = selective_scan_step(state.ssm, x, dt, decay_rates(self.A_log), B, C)
        return self._output(y, x, gate), Mamba1State(conv=conv, ssm=ssm)

    def _project(self, hidden: torch.Tensor, injection: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        xz = self.in_proj(hidden)
        if injection is not None:
            xz = xz + injection
        x, gate = xz.chunk(2, dim=-1)
        return x, gate

    def _select(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The input-dependent SSM parameters, read off the conv output: dt (one positive
        step per channel), B and C."""
        d = self.dims
        dt, B, C = torch.split(self.x_proj(x), [d.dt_rank, d.d_state, d.d_state], dim=-1)
        return F.softplus(self.dt_proj(dt)), B, C

    def _output(self, y: torch.Tensor, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.out_proj((y + x * self.D) * F.silu(gate))
