"""Tasks: what an evaluation runs on and what a training run reads. Each names its test data
(word problems, a shard split, a catbAbI folder), scores a model on it and shows the rows;
``eval/`` runs the same length, budget and convergence evaluations over any of them.

``TASKS`` is the one table of them: a task's entry (``TaskEntry``) names its class, the records
its evaluations write, its command-group shortcuts and, for a task that trains, what the
trainer takes of it (``Training``). The command line builds its choices and helps from the
table before torch loads, so this module imports no task's module: an entry names its classes
by path, and ``task_class`` / ``batches_class`` import them when a command runs."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from ..core.errors import OptionError

# The evaluations ``eval/`` runs over a task; an entry's records name those it takes, in this order.
EVALUATIONS = ("length", "budget", "convergence")


def _class(path: str) -> type:
    """The class ``path`` names, "<module>:<class>" (an entry point's form), the module
    relative to this package where it starts with a dot."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module, __name__), name)


# The entries are named tuples, not dataclasses: dataclasses imports inspect, which would add
# a tenth to the time the command line takes to answer --help.
class Training(NamedTuple):
    """What a task that trains gives the trainer (``TrainConfig.task``): its training batches,
    whose class also holds what only that task does in training (its held-out split, its step
    metrics), the ``TrainConfig`` defaults it changes and the fields only it reads (another
    task refuses them)."""

    batches_path: str  # "<module>:<class>" of its training batches
    defaults: Mapping[str, Any] = MappingProxyType({})
    own_fields: tuple[str, ...] = ()

    def batches_class(self) -> type:
        return _class(self.batches_path)


class TaskEntry(NamedTuple):
    """A task's line of the table: its ``name`` (the value of ``--task``), its class
    (``class_path``, "<module>:<class>"; the class names this entry back), the record each of
    its evaluations writes (``records``, in ``EVALUATIONS``' order: the evaluations it takes),
    the sequences per batch it evaluates by default (``batch_size``), the shortcuts of its
    command group (``aliases``: command, evaluation, help) and, if it trains, its ``training``."""

    name: str
    class_path: str
    records: Mapping[str, str]
    batch_size: int
    aliases: tuple[tuple[str, str, str], ...] = ()
    training: Training | None = None

    def task_class(self) -> type:
        return _class(self.class_path)


TASKS: dict[str, TaskEntry] = {entry.name: entry for entry in (
    TaskEntry(
        "words", ".words:WordsTask",
        {"length": "word_length", "budget": "word_budget", "convergence": "convergence"},
        batch_size=256,
        aliases=(
            ("eval", "length", "per-token accuracy of a checkpoint by test length (length extrapolation)"),
            ("convergence", "convergence", "passes each token needs in sequential mode; hard vs easy tokens"),
        ),
        # Word problems train short words in large batches, without weight decay.
        training=Training(".words:WordBatches", {
            "sequence_length": 16, "batch_size": 128, "batch_tokens": 0, "total_steps": 500, "betas": (0.9, 0.999),
            "weight_decay": 0.0, "warmup_steps": 50, "decay_fraction": 0.0, "bounded_fraction": 1.0,
            "log_every": 25, "checkpoint_every": 0, "keep_checkpoints": 1,
        }, own_fields=("group", "hard_prob")),
    ),
    TaskEntry(
        "lm", ".lm:LMTask",
        {"length": "lm_length", "budget": "lm_budget", "convergence": "convergence"},
        batch_size=8,
        aliases=(("eval", "length", "held-out perplexity of a checkpoint by context length (length extrapolation)"),),
        # The paper's language-model settings are ``TrainConfig``'s own defaults.
        training=Training(".lm:TokenBatches", own_fields=("eval_every", "eval_batches")),
    ),
    TaskEntry(
        "catbabi", ".catbabi:CatbabiTask",
        {"length": "catbabi", "budget": "catbabi_budget"},
        batch_size=8,
        aliases=(("eval", "length", "answer accuracy of a checkpoint, overall and per task"),),
    ),
)}


# Each task that trains (``TrainConfig.task``): what the trainer takes of it.
TRAINING: dict[str, Training] = {name: entry.training for name, entry in TASKS.items() if entry.training}


def make_task(name: str, checkpoint: str | Path, dtype: str | None = None, device: str | None = None,
              **options: Any):
    """The task ``name`` (a ``tasks.base.Task``) on ``checkpoint`` with ``options`` (None: the
    task's default), which must all be the task's own: another task's option is refused in one
    line. ``dtype``: the model's, for any task (None: as saved); ``device``: where it runs
    (``usable_device``'s names; None: the CPU). How it solves (the budget ``max_iter``, ``tol``,
    ``solver`` ...) is ``Task.solve_with``'s."""
    # torch comes with these, so with a task made, not with the table.
    from ..core.devices import usable_device
    from ..models.loading import torch_dtype

    if name not in TASKS:
        raise OptionError(f"unknown task {name!r}; one of {', '.join(TASKS)}")
    task = TASKS[name].task_class()
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
