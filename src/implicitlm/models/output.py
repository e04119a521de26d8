"""What a forward pass returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.utils import ModelOutput

from ..deq.stats import FixedPointStats


@dataclass
class ImplicitLMOutput(ModelOutput):
    """``fixed_point``: convergence of the solve (per sample, or per sample and token in
    sequential mode); None for explicit models. ``state``: recurrent state after the last token.
    ``hidden_states`` (with ``output_hidden_states``): every block's input and the stack's
    output, transformers' layout; for an implicit model, those of one pass at the fixed point."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    fixed_point: FixedPointStats | None = None
    state: Any = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
