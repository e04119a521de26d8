"""Length extrapolation over any task: a checkpoint's rows at each test length (word accuracy,
perplexity by context, catbAbI answer accuracy), their table, and the task's record."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from ..tasks.base import Task, budget_line
from .records import claimed_records, write_task_record


def evaluate_by_length(
    task: Task,
    mode: str = "simultaneous",
    out: str | Path | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """``task``'s rows at each of its test lengths, solved as its ``fixed_point`` settings
    say (``Task.solve_with``; by default the model's own). Returns ``rows``, the printed
    ``table`` (the budget's line first: ``Task.budget``) and, with ``out``, the ``files`` written
    there (the record the task makes of its rows, ``Task.length_record``, with the ``budget``,
    and its figure; a record already there is refused, before the evaluation, unless
    ``overwrite``)."""
    with contextlib.nullcontext() if out is None else claimed_records(out, [task.experiment], overwrite):
        model, test_sets = task.prepare("length")
        task.require_sweep_time(model, test_sets, mode, f"an evaluation at {len(test_sets)} test lengths",
                                arguments=("lengths",), hint="; give fewer or shorter lengths")
        rows = task.evaluate_sets(model, test_sets, mode=mode, progress=progress)
        budget = task.budget(mode)
        files = None
        if out is not None:
            record = task.length_record(rows, mode)
            record = dataclasses.replace(record, details={**record.details, "budget": budget})
            files = write_task_record(out, task.checkpoint, model, record, task.fixed_point)
    return {"rows": rows, "table": f"{budget_line(budget)}\n{task.format_rows(rows)}", "files": files}
