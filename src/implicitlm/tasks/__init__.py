"""Tasks: what an evaluation runs on and what a training run reads. Each names its test data
(word problems, a shard split, a catbAbI folder), scores a model on it and shows the rows;
``eval/`` runs the same length, budget and convergence evaluations over any of them. A task
that trains gives the trainer its batches (``TRAINING_BATCHES``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.devices import usable_device
from ..core.errors import OptionError
from ..models.loading import torch_dtype
from .base import Task
from .catbabi import CatbabiTask
from .lm import LMTask, TokenBatches
from .words import WordBatches, WordsTask

TASKS: dict[str, type[Task]] = {task.name: task for task in (WordsTask, LMTask, CatbabiTask)}
# The training batches of each task that trains (``TrainConfig.task``): what the trainer reads,
# and what only that task does in training (its held-out split, its step metrics).
TRAINING_BATCHES: dict[str, type[WordBatches | TokenBatches]] = {"words": WordBatches, "lm": TokenBatches}


def make_task(name: str, checkpoint: str | Path, dtype: str | None = None, device: str | None = None,
              **options: Any) -> Task:
    """Task ``name`` on ``checkpoint`` with ``options`` (None: the task's default), which must
    all be the task's own: another task's option is refused in one line. ``dtype``: the
    model's, for any task (None: as saved); ``device``: where it runs (``usable_device``'s
    names; None: the CPU). How it solves (the budget ``max_iter``, ``tol``,
    ``solver`` ...) is ``Task.solve_with``'s."""
    if name not in TASKS:
        raise OptionError(f"unknown task {name!r}; one of {', '.join(TASKS)}")
    task = TASKS[name]
    given = {key: value for key, value in options.items() if value is not None}
    foreign = [key for key in given if key not in task.OPTIONS]
    if foreign:
        raise OptionError(
            f"{', '.join(foreign)} {'does' if len(foreign) == 1 else 'do'} not apply to the {name} task", arguments=foreign,
        )
    made = task(checkpoint, **given)
    made.dtype = torch_dtype(dtype)  # a wrong name is refused here, before any data is read
    made.device = usable_device(device)
    return made
