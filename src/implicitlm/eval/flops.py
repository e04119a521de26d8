"""Floating-point operations per token of a forward, counted from the operations it runs.

torch's ``FlopCounterMode`` counts the matrix products, convolutions and attention a forward
runs: the arithmetic that grows with the model (elementwise work is left out, as the FLOP
counts of language models leave it). A budget of exactly K passes is counted as it runs, on
one sequence of the evaluation's length. A solve to a tolerance stops where its samples
converge, so its count is made of its parts: what a forward spends besides the stack's passes,
and one pass of the stack, times the passes its solves took (a solver's own arithmetic, such
as Anderson's mixing of its iterates, left out).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..core.errors import OptionError


def flops_per_token(model, mode: str, length: int, fixed_point: dict[str, Any] | None = None) -> float:
    """The FLOPs per token of ``model``'s forward over one sequence of ``length`` tokens in
    ``mode``, given ``fixed_point`` (``forward``'s argument): an evaluation's, the model in
    evaluation mode (in training a forward spends the training phase's budget instead)."""
    if model.training:
        raise OptionError("FLOPs are counted of an evaluation's forward: put the model in evaluation mode (eval())")
    tokens = torch.zeros((1, length), dtype=torch.long, device=next(model.parameters()).device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(tokens, mode=mode, fixed_point=fixed_point)
    return counter.get_total_flops() / length


def solved_flops_per_token(model, mode: str, length: int, fixed_point: dict[str, Any] | None,
                           passes_mean: float) -> float:
    """The FLOPs per token of an implicit model's forward whose solves, given ``fixed_point``,
    took ``passes_mean`` passes each (a row's ``fp_passes_mean``: a sequence's, all its chunks
    together, in simultaneous mode; a token's in sequential mode): one pass counted, and each
    pass more as the second pass of a count at 2 costs."""
    settings = dict(fixed_point or {})
    one, two = (flops_per_token(model, mode, length, {**settings, "passes": count}) for count in (1, 2))
    chunk = model.fixed_point_options(settings).chunk_length if mode == "simultaneous" else 0
    # A simultaneous solve in chunks counts every chunk's passes in its sample's; a pass of the
    # count above is one over every chunk.
    chunks = math.ceil(length / chunk) if chunk else 1
    return one + (passes_mean / chunks - 1) * (two - one)
