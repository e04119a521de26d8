"""The learning-rate schedule both trainers use: transformers' warmup-stable-decay."""

from __future__ import annotations

import torch
from transformers import get_wsd_schedule


def warmup_stable_sqrt_decay(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, decay_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, constant, then the authors' square-root decay to ``min_lr_ratio`` of the peak
    over the last ``decay_steps``. Warm-up wins where the two would overlap, so a short run with a
    long warm-up still reaches its peak before it decays."""
    warmup_steps = min(warmup_steps, total_steps)
    decay_steps = min(decay_steps, total_steps - warmup_steps)
    return get_wsd_schedule(
        optimizer,
        num_warmup_steps=warmup_steps,
        num_decay_steps=decay_steps,
        num_stable_steps=total_steps - warmup_steps - decay_steps,
        decay_type="1-sqrt",
        min_lr_ratio=min_lr_ratio,
    )
