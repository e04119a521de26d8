"""What a transformers ``MambaForCausalLM`` checkpoint's config becomes in this family's options."""

from __future__ import annotations

from typing import Any

from transformers import MambaConfig

from ..source_options import shared_mamba_options


def mamba_options(config: MambaConfig) -> dict[str, Any]:
    # Only the initialisation reads time_step_scale / _init_scheme / _floor and
    # rescale_prenorm_residual; use_mambapy and use_associative_scan choose how the same
    # scan is computed; residual_in_fp32 matters below float32 only.
    return dict(shared_mamba_options(config), time_step_rank=config.time_step_rank)
