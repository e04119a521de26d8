"""Length extrapolation over any task: a checkpoint's rows at each test length (word accuracy,
perplexity by context, catbAbI answer accuracy), their table, and the task's record."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..core.errors import OptionError
from ..tasks.base import Task
from ..tasks.catbabi import CatbabiTask
from ..tasks.lm import LMTask
from ..tasks.words import WordsTask
from .catbabi import write_catbabi_results
from .perplexity import lm_length_record
from .records import claimed_records, record_files
from .words import word_length_record


def evaluate_by_length(
    task: Task,
    mode: str = "simultaneous",
    out: str | Path | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """``task``'s rows at each of its test lengths, solved as its ``fixed_point`` settings
    say (``Task.solve_with``; by default the model's own). Returns ``rows``, the printed
    ``table`` and, with ``out``, the ``files`` written there (the task's record and its
    figure; a record already there is refused, before the evaluation, unless ``overwrite``)."""
    with contextlib.nullcontext() if out is None else claimed_records(out, [task.experiment], overwrite):
        model, test_sets = task.prepare("length")
        rows = [
            task.evaluate(model, test_set, mode=mode, progress=progress)
            for test_set in tqdm(test_sets, desc="eval", disable=not progress)
        ]
        files = write_length_record(task, model, rows, out, mode) if out is not None else None
    return {"rows": rows, "table": task.format_rows(rows), "files": files}


def write_length_record(task: Task, model, rows: list[dict[str, Any]], out: str | Path, mode: str) -> tuple[Path, Path]:
    """Each task's own record of a length evaluation (``word_length``, ``lm_length``,
    ``catbabi``): the JSON file and its figure."""
    writer = next((LENGTH_RECORDS[kind] for kind in type(task).__mro__ if kind in LENGTH_RECORDS), None)
    if writer is None:
        raise OptionError(f"--out: no length record for task {task.name!r}")
    writer(task, model, rows, out, mode)
    return record_files(out, task.experiment)


# The writer of each task's length record. They live here, not on the task: the records and
# their figures are eval's, and tasks/ sits below eval/.
LENGTH_RECORDS = {
    WordsTask: lambda task, model, rows, out, mode: word_length_record(
        model, task.checkpoint, rows, out, task.group, mode, task.train_length
    ),
    LMTask: lambda task, model, rows, out, mode: lm_length_record(
        model, task.checkpoint, rows, out, mode, task.train_length
    ),
    CatbabiTask: lambda task, model, rows, out, mode: write_catbabi_results(
        out, task.checkpoint, model, rows[0], **task.record_settings(mode)
    ),
}
