"""The trainer's learning-rate schedule: transformers' warmup-stable-decay."""

from __future__ import annotations

import torch
from transformers import get_wsd_schedule


def warmup_stable_sqrt_decay(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, decay_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, constant, then the authors' square-root decay to ``min_lr_ratio`` of the peak
    over the last ``decay_steps``. Warm-up wins where the two would overlap, so a short run with a
    long warm-up still reaches its peak before it decays. The warm-up does not depend on
    ``total_steps``: a run resumed with more steps keeps the rates it had."""
    decay_steps = max(0, min(decay_steps, total_steps - warmup_steps))
    return get_wsd_schedule(
        optimizer,
        num_warmup_steps=warmup_steps,
        num_decay_steps=decay_steps,
        num_stable_steps=max(0, total_steps - warmup_steps - decay_steps),
        decay_type="1-sqrt",
        min_lr_ratio=min_lr_ratio,
    )


def apply_current_rate(scheduler: torch.optim.lr_scheduler.LambdaLR, peak_lr: float) -> None:
    """After a restore: the schedule's peak is ``peak_lr`` (the run's ``lr`` now, which a
    resume may change; the restored state holds the old one), and each parameter group's
    rate is the schedule's at the restored step. The optimiser's saved rate is the one for
    the step after the last, which past the end of a run is the floor: a run resumed with
    more steps must go on at the rate its new schedule gives."""
    scheduler.base_lrs = [peak_lr] * len(scheduler.optimizer.param_groups)
    for group, factor in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas):
        group["initial_lr"] = peak_lr
        group["lr"] = peak_lr * factor(scheduler.last_epoch)
