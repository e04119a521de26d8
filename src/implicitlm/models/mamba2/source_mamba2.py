"""What a transformers ``Mamba2ForCausalLM`` checkpoint's config becomes in this family's options."""

from __future__ import annotations

import math
from typing import Any

from transformers import Mamba2Config

from ..source_options import refuse, shared_mamba_options


def mamba2_options(config: Mamba2Config) -> dict[str, Any]:
    options = shared_mamba_options(config)
    refuse(tuple(config.time_step_limit) != (0.0, math.inf), f"time_step_limit={config.time_step_limit} (dt clamping)")
    return dict(options, head_dim=config.head_dim, n_groups=config.n_groups, chunk_size=config.chunk_size)
