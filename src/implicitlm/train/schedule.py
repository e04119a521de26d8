"""The trainer's learning-rate schedule: warm-up, stable, then a square-root decay (transformers'
``get_wsd_schedule`` with ``decay_type="1-sqrt"``), and how a resumed run goes on with it.

A resume may change the settings the schedule is planned from (most often: more steps). The
run then goes on with the schedule the new settings give, from its step, except that a decay
once begun never turns back: where the new schedule's rate is above the rate the run had
reached (a run resumed with more steps after its decay began; a finished run had reached its
floor), the rest of the run is a decay re-planned from that rate down to ``min_lr`` over the
steps left. The plan a run follows is part of the scheduler's state, so a later resume goes
on from the re-planned decay.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch


class LearningRatePlan:
    """The share of the peak rate at each step: a linear warm-up from ``min_lr_ratio`` over
    ``warmup_steps``, ``start_share`` up to ``decay_start``, then 1 - sqrt down to
    ``min_lr_ratio`` over ``decay_steps``, that floor past them. A callable object rather than
    a function: the scheduler's state holds an object's attributes, and so the plan followed."""

    def __init__(
        self, warmup_steps: int, decay_start: int, decay_steps: int, min_lr_ratio: float, start_share: float = 1.0,
    ):
        self.warmup_steps, self.decay_start, self.decay_steps = warmup_steps, decay_start, decay_steps
        self.min_lr_ratio, self.start_share = min_lr_ratio, start_share

    def __call__(self, step: int) -> float:
        # The arithmetic of transformers' schedule, so that a fresh plan gives its very rates.
        if step < self.warmup_steps:
            progress = float(step) / float(max(1, self.warmup_steps))
            return max(0.0, progress * (1.0 - self.min_lr_ratio) + self.min_lr_ratio)
        if step < self.decay_start:
            return self.start_share
        if step < self.decay_start + self.decay_steps:
            progress = float(step - self.decay_start) / float(max(1, self.decay_steps))
            return max(0.0, (1.0 - math.sqrt(progress)) * (self.start_share - self.min_lr_ratio) + self.min_lr_ratio)
        return self.min_lr_ratio

    def continued_with(self, plan: LearningRatePlan, step: int) -> LearningRatePlan:
        """What a run that followed this plan up to ``step`` goes on with, now that its
        settings give ``plan``: ``plan`` where this plan's decay had not begun (a run without
        one ends at its peak: the floor past its end is no rate it decays to), in ``plan``'s
        warm-up, or where ``plan`` does not raise the rate above this plan's at ``step``;
        else a decay from this plan's share at ``step`` to ``plan``'s floor, over the steps
        ``plan`` has left; this plan itself where it is such a decay already, to that floor
        and ending there."""
        reached = self(step)
        if not self.decay_steps or step <= self.decay_start or step < plan.warmup_steps or plan(step) <= reached:
            return plan
        end, floor = plan.decay_start + plan.decay_steps, min(plan.min_lr_ratio, reached)
        if (self.decay_start + self.decay_steps, self.min_lr_ratio) == (end, floor):
            return self
        return LearningRatePlan(plan.warmup_steps, step, end - step, floor, reached)


def planned(warmup_steps: int, total_steps: int, decay_steps: int, min_lr_ratio: float) -> LearningRatePlan:
    """Linear warm-up, constant, then the authors' square-root decay to ``min_lr_ratio`` of the
    peak over the last ``decay_steps``. Warm-up wins where the two would overlap, so a short run
    with a long warm-up still reaches its peak before it decays. The warm-up does not depend on
    ``total_steps``: a run resumed with more steps keeps the rates it had."""
    decay_steps = max(0, min(decay_steps, total_steps - warmup_steps))
    stable_steps = max(0, total_steps - warmup_steps - decay_steps)
    return LearningRatePlan(warmup_steps, warmup_steps + stable_steps, decay_steps, min_lr_ratio)


def config_plan(config) -> LearningRatePlan:
    """The plan of a run's training options (``TrainConfig``): ``decay_fraction`` of all steps decay."""
    decay_steps = round(config.decay_fraction * config.total_steps)
    return planned(config.warmup_steps, config.total_steps, decay_steps, config.min_lr / config.lr)


def restore_schedule(
    scheduler: torch.optim.lr_scheduler.LambdaLR, state: dict[str, Any], recorded: Callable[[], LearningRatePlan],
    peak_lr: float,
) -> None:
    """``scheduler`` (planned from this run's settings) at the step of its saved ``state``,
    going on as the module says from the plan the run followed: the one the state holds, or
    ``recorded`` (planned from the settings the checkpoint records) for a state saved before
    states held their plan. The peak is ``peak_lr`` (the run's ``lr`` now, which a resume may
    change), and each parameter group's rate is the plan's at the restored step: the
    optimiser's saved rate is the one for the step after the last, which past the end of a
    run is the floor."""
    saved_plans = state.get("lr_lambdas") or [None]
    scheduler.load_state_dict({**state, "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
    followed = LearningRatePlan(**saved_plans[0]) if saved_plans[0] else recorded()
    plan = followed.continued_with(scheduler.lr_lambdas[0], scheduler.last_epoch)
    scheduler.lr_lambdas = [plan] * len(scheduler.optimizer.param_groups)
    scheduler.base_lrs = [peak_lr] * len(scheduler.optimizer.param_groups)
    for group in scheduler.optimizer.param_groups:
        group["initial_lr"] = peak_lr
        group["lr"] = peak_lr * plan(scheduler.last_epoch)
