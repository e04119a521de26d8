"""Configuration of the Mamba2 family: ``ImplicitMamba2Config``."""

from __future__ import annotations

from typing import Any

from ...core.schema import POSITIVE, Rule, at_least, option_error
from ..configuration import WHAT, ImplicitLMConfig, check_time_steps, set_arguments


class ImplicitMamba2Config(ImplicitLMConfig):
    """Mamba2 blocks (no MLP); field names follow ``transformers.Mamba2Config``."""

    model_type = "implicit_mamba2"
    FIELD_RULES = {
        "state_size": at_least(1), "conv_kernel": at_least(1), "expand": at_least(1), "head_dim": at_least(1),
        "n_groups": at_least(1), "chunk_size": at_least(1), "time_step_min": POSITIVE, "time_step_max": POSITIVE,
        "a_init_range": Rule("with 0 < low <= high", lambda bounds: 0 < bounds[0] <= bounds[1]),
    }
    FIELD_HELP = {
        "state_size": "SSM state per head (N)",
        "conv_kernel": "width of the causal convolution",
        "expand": "inner width = expand x hidden_size",
        "head_dim": "width of a head (P); heads = inner width / head_dim",
        "n_groups": "groups sharing B and C",
        "chunk_size": "chunk length of the parallel SSD scan (cost, not function)",
        "time_step_min": "smallest initial time step",
        "time_step_max": "largest initial time step",
        "a_init_range": "range of the initial decay rates A",
    }

    def __init__(
        self, state_size: int = 128, conv_kernel: int = 4, expand: int = 2, head_dim: int = 64, n_groups: int = 1,
        chunk_size: int = 256, time_step_min: float = 1e-3, time_step_max: float = 0.1,
        a_init_range: tuple[float, float] = (1.0, 16.0), **kwargs: Any,
    ) -> None:
        set_arguments(self, ImplicitMamba2Config, locals())
        self.a_init_range = tuple(a_init_range)
        super().__init__(**kwargs)

    def check_consistency(self) -> None:
        check_time_steps(self)
        inner = self.expand * self.hidden_size
        if inner % self.head_dim:
            raise option_error(WHAT, "head_dim", f"a divisor of expand * hidden_size = {inner}", self.head_dim)
        if (inner // self.head_dim) % self.n_groups:
            heads = f"expand * hidden_size / head_dim = {inner // self.head_dim}"
            raise option_error(WHAT, "n_groups", f"a divisor of the number of heads {heads}", self.n_groups)
