"""The step size and decay parameters that the Mamba1 and Mamba2 mixers share.

Both discretise a continuous-time SSM with a learned, input-dependent step dt > 0 (a
softplus of a biased projection) and a decay rate A = -exp(A_log) < 0, so that
exp(dt * A) lies in (0, 1).
"""

from __future__ import annotations

import math

import torch


def initial_dt_bias(size: int, dt_min: float, dt_max: float, floor: float) -> torch.Tensor:
    """mamba_ssm's dt bias: softplus(bias) is log-uniform in [dt_min, dt_max], lifted to ``floor``."""
    dt = torch.exp(torch.rand(size) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
    # The inverse of softplus.
    return dt + torch.log(-torch.expm1(-dt))


def decay_rates(A_log: torch.Tensor) -> torch.Tensor:
    """A = -exp(A_log), in at least float32: exp(dt * A) is sensitive to rounding."""
    return -torch.exp(A_log.to(torch.promote_types(A_log.dtype, torch.float32)))


def ssm_state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an SSM state is kept and updated in for inputs of ``dtype``: at least
    float32. The state sums a decaying history over the whole sequence; rounded to half
    precision at every token it loses the small late contributions, and the error of a
    recurrent model compounds with its length (mamba_ssm and flash-linear-attention keep
    their recurrent states in float32 for the same reason)."""
    return torch.promote_types(dtype, torch.float32)
