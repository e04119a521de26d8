"""Configuration of the Mamba (Mamba1) family: ``ImplicitMambaConfig``."""

from __future__ import annotations

import math
from typing import Any

from ...core.schema import POSITIVE, Rule, at_least
from ..configuration import ImplicitLMConfig, check_time_steps, set_arguments


class ImplicitMambaConfig(ImplicitLMConfig):
    """Mamba1 blocks (no MLP); field names follow ``transformers.MambaConfig``.

    ``time_step_rank``: the rank of dt's projection, "auto" for ceil(hidden_size / 16).
    ``chunk_size``: the chunk length of the parallel scan; it changes the cost (work and
    memory grow with its square), not the function.
    """

    model_type = "implicit_mamba"
    FIELD_RULES = {
        "state_size": at_least(1), "conv_kernel": at_least(1), "expand": at_least(1), "chunk_size": at_least(1),
        "time_step_min": POSITIVE, "time_step_max": POSITIVE,
        "time_step_rank": Rule(
            "an integer >= 1 or 'auto'",
            lambda rank: rank == "auto" or isinstance(rank, int) and rank >= 1,
            replaces_type=True,
        ),
    }
    FIELD_HELP = {
        "state_size": "SSM state per channel (N)",
        "conv_kernel": "width of the causal convolution",
        "expand": "inner width = expand x hidden_size",
        "time_step_rank": "rank of the time step's projection (auto: ceil(hidden_size / 16))",
        "time_step_min": "smallest initial time step",
        "time_step_max": "largest initial time step",
        "chunk_size": "chunk length of the parallel scan (cost, not function)",
    }

    def __init__(
        self, state_size: int = 16, conv_kernel: int = 4, expand: int = 2, time_step_rank: int | str = "auto",
        time_step_min: float = 1e-3, time_step_max: float = 0.1, chunk_size: int = 4, **kwargs: Any,
    ) -> None:
        set_arguments(self, ImplicitMambaConfig, locals())
        super().__init__(**kwargs)
        # Resolved after the shared fields are set: "auto" depends on hidden_size.
        if time_step_rank == "auto":
            time_step_rank = math.ceil(self.hidden_size / 16)
        self.time_step_rank = time_step_rank

    def check_consistency(self) -> None:
        check_time_steps(self)
