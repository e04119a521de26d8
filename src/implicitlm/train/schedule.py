"""Learning-rate schedules as multipliers of the peak rate, for ``LambdaLR``."""

from __future__ import annotations

import math


def warmup_constant(warmup_steps: int):
    """Linear warm-up to the peak, then constant."""

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / max(1, warmup_steps))

    return factor


def warmup_constant_sqrt_decay(
    warmup_steps: int, total_steps: int, decay_steps: int, peak_lr: float, min_lr: float
):
    """Linear warm-up, constant, then square-root decay to ``min_lr`` over the last ``decay_steps``."""
    floor = min_lr / peak_lr

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        decay_start = total_steps - decay_steps
        if step < decay_start or decay_steps == 0:
            return 1.0
        progress = min(1.0, (step - decay_start) / decay_steps)
        return floor + (1.0 - floor) * (1.0 - math.sqrt(progress))

    return factor
