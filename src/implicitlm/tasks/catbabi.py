"""catbAbI as a task: answer accuracy, overall and per bAbI task, in either inference mode, and
the ``catbabi`` record.

The model reads a split's stream (see implicitlm.data.catbabi) in windows of
``sequence_length`` tokens; an answer counts as right when the argmax of the logits at the
"?" before it (a causal LM: logits at p predict token p + 1) is the answer token.

Windows. A story runs on across window borders, and its answer rests on the facts before
it, so an answer should be scored with as much of its story in the window as can be had.
Windows start every ``stride`` tokens; an answer is scored in exactly one, the first whose
last ``stride`` targets hold it (in the first window, any target). So every answer sees more
than ``sequence_length - stride`` tokens before it (all the stream before it where that is
shorter), and the stream is run about ``sequence_length / stride`` times over. A window
ending at each answer would give every answer the full window, but bAbI asks a question
every 20 or so tokens, so that costs about ``sequence_length / 20`` passes (13 at 256);
the default stride, half the window, guarantees half the window for two passes.
``stride = sequence_length`` gives the non-overlapping windows of training and perplexity.
Only windows that score an answer are run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.errors import DataError, OptionError
from ..data.catbabi import SHARD_SPLITS, read_answers
from ..data.shards import TokenShards
from ..deq import warn_not_converged
from . import TASKS
from .base import Figure, FolderTask, TaskRecord, convergence_line, forward_seconds


def window_starts(positions: np.ndarray, stream_length: int, sequence_length: int, stride: int) -> np.ndarray:
    """For each answer position, the start of the window that scores it (module docstring);
    windows are ``min(sequence_length, stream_length)`` tokens long."""
    if not 1 <= stride <= sequence_length:
        raise OptionError(f"stride must lie in [1, sequence_length={sequence_length}], got {stride}")
    length = min(sequence_length, stream_length)
    # Window k scores targets kS + length - S + 1 .. kS + length; the first scores 1 .. length.
    windows = np.maximum(0, -(-(positions - length) // stride))
    # Near the end the window slides back to fit the stream, which only adds context.
    return np.minimum(windows * stride, stream_length - length)


def window_stride(sequence_length: int, stride: int | None) -> int:
    """The step between windows: ``stride``, by default half a window."""
    return max(1, sequence_length // 2) if stride is None else stride


@torch.no_grad()
def answer_accuracy(
    model, data_dir: str | os.PathLike, split: str = "test", sequence_length: int = 256, stride: int | None = None,
    mode: str = "simultaneous", max_iter: int | None = None, tol: float | None = None, batch_size: int = 8,
    progress: bool = False, warn: bool = True, fixed_point: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Answer accuracy of ``model`` on bAbI split ``split`` of a built catbAbI folder, every
    forward given ``fixed_point`` (``forward``'s argument).

    Returns ``accuracy`` and ``answers`` over all tasks, ``tasks`` {task: {"accuracy",
    "answers"}}, the ``stride`` used and the number of ``windows`` run, and for implicit
    models the mean passes of those windows' solves and how many of their fixed
    points stopped above the tolerance (``ConvergenceTally.as_dict``); ``warn``: say so in one
    logged line when any did.
    """
    answers = read_answers(data_dir, split)
    shards = TokenShards(data_dir, SHARD_SPLITS[split], verify=True)
    if model.config.vocab_size < shards.vocab_size:
        raise DataError(
            f"{data_dir}: its vocabulary has {shards.vocab_size} tokens, more than the model's "
            f"{model.config.vocab_size}: the model was trained on other data"
        )
    stream = torch.from_numpy(shards.read(0, len(shards)).astype(np.int64))
    stride = window_stride(sequence_length, stride)
    starts = window_starts(answers.positions, len(stream), sequence_length, stride)
    length = min(sequence_length, len(stream))
    unique_starts = np.unique(starts)
    expected = stream.numpy()[answers.positions]
    device = next(model.parameters()).device
    correct = np.zeros(len(answers.positions), dtype=bool)
    passes = []
    was_training = model.training
    model.eval()
    try:
        with model.track_convergence() as tally:
            for first in tqdm(range(0, len(unique_starts), batch_size), desc="catbabi", disable=not progress):
                batch = unique_starts[first : first + batch_size]
                inputs = torch.stack([stream[start : start + length] for start in batch]).to(device)
                output = model(inputs, mode=mode, max_iter=max_iter, tol=tol, fixed_point=fixed_point)
                predictions = output.logits.argmax(-1).cpu().numpy()
                # Answers come in stream order, so their window starts never decrease.
                scored = slice(np.searchsorted(starts, batch[0]), np.searchsorted(starts, batch[-1], side="right"))
                rows = np.searchsorted(batch, starts[scored])
                columns = answers.positions[scored] - 1 - starts[scored]
                correct[scored] = predictions[rows, columns] == expected[scored]
                if output.fixed_point is not None:
                    passes.append(output.fixed_point.passes.float().mean().item())
    finally:
        model.train(was_training)
    result = {**_summary(correct, answers.tasks, passes), "stride": stride, "windows": len(unique_starts)}
    if passes:
        result.update(tally.as_dict())
        if warn:
            warn_not_converged(tally, f"catbAbI {split} ({mode} mode)")
    return result


def _summary(correct: np.ndarray, tasks: np.ndarray, passes: list[float]) -> dict[str, Any]:
    if not len(correct):
        raise DataError("the split has no answers to score")
    result: dict[str, Any] = {
        "accuracy": float(correct.mean()),
        "answers": len(correct),
        "tasks": {
            int(task): {"accuracy": float(correct[tasks == task].mean()), "answers": int((tasks == task).sum())}
            for task in np.unique(tasks)
        },
    }
    if passes:
        result["fp_passes_mean"] = float(np.mean(passes))
    return result


def format_task_table(result: dict[str, Any]) -> str:
    """Per-task accuracy and answer counts, then the overall line, as aligned text."""
    lines = [f"{'task':>6}{'answers':>9}{'accuracy':>10}"]
    for task, row in sorted(result["tasks"].items()):
        lines.append(f"{task:>6}{row['answers']:>9}{row['accuracy']:>10.1%}")
    lines.append(f"{'all':>6}{result['answers']:>9}{result['accuracy']:>10.1%}")
    return "\n".join(lines)


class CatbabiTask(FolderTask):
    """catbAbI answer accuracy on bAbI split ``split`` of a built folder (``data``), in windows of
    ``sequence_length`` tokens every ``stride`` tokens (see the module's docstring); one set,
    whose row is ``answer_accuracy``'s with the window length as its ``length``. Per-token
    convergence is not counted here: the folder is token shards, which ``--task lm`` reads."""

    entry = TASKS["catbabi"]
    FOLDER = "implicitlm catbabi build"
    OPTIONS = ("data", "split", "sequence_length", "stride", "batch_size")
    quality = "accuracy"

    def __init__(
        self, checkpoint: str | Path, *, data: Any = None, split: str | None = None,
        sequence_length: int | None = None, stride: int | None = None, batch_size: int | None = None,
    ):
        super().__init__(checkpoint, data, split, batch_size)
        if self.split not in SHARD_SPLITS:
            raise OptionError(f"split={self.split}: the catbabi task reads a bAbI split, one of {', '.join(SHARD_SPLITS)}",
                              arguments=("split",))
        self.sequence_length = 256 if sequence_length is None else sequence_length
        self.stride = stride

    def refusal_hint(self, evaluation: str) -> str:
        return f": its folder is token shards, so evaluate it as the lm task, split=eval"

    def evaluation_sets(self) -> list[int]:
        return [self.sequence_length]

    def evaluate(self, model, test_set, mode="simultaneous", fixed_point=None, warn=True, progress=False):
        result = answer_accuracy(
            model, self.data, self.split, test_set, self.stride, mode, batch_size=self.batch_size, progress=progress,
            warn=warn, fixed_point=self.settings(fixed_point),
        )
        return {"length": test_set, **result}

    def one_pass_seconds(self, model, test_set, mode):
        # The windows answer_accuracy runs: one per distinct start of an answer's window.
        stream_length = len(TokenShards(self.data, SHARD_SPLITS[self.split]))
        positions = read_answers(self.data, self.split).positions
        starts = window_starts(positions, stream_length, test_set, window_stride(test_set, self.stride))
        windows = len(np.unique(starts))
        return forward_seconds(model, mode, min(self.batch_size, windows), min(test_set, stream_length),
                               -(-windows // self.batch_size), self.fixed_point)

    def format_rows(self, rows: list[dict[str, Any]]) -> str:
        return "\n".join(filter(None, (text for row in rows for text in (format_task_table(row), convergence_line(row)))))

    def length_record(self, rows, mode) -> TaskRecord:
        """``catbabi``: answer accuracy overall and per bAbI task (``task_01`` ...), with the
        settings it was scored with; its figure a bar per task, the overall accuracy a line."""
        result = rows[0]
        metrics = {"accuracy": result["accuracy"]}
        metrics.update({f"task_{task:02d}": row["accuracy"] for task, row in result["tasks"].items()})
        metrics.update({key: result[key] for key in ("fp_passes_mean", "fp_not_converged_share") if key in result})
        details = {key: result[key] for key in ("answers", "stride", "windows")}
        details["tasks"] = {str(task): row for task, row in result["tasks"].items()}
        # The budget as solved: the model's own, or as the task's fixed_point settings set it.
        options = self.model.fixed_point_options(self.fixed_point)
        max_iter, tol = options.budget(None, None, mode)
        details.update(data=str(self.data), split=self.split, sequence_length=self.sequence_length, mode=mode,
                       max_iter=max_iter, tol=tol, passes=options.passes)
        tasks = sorted(result["tasks"])
        bars = {"label": "", "x": tasks, "y": [result["tasks"][task]["accuracy"] for task in tasks]}
        figure = Figure(
            "bars", f"catbAbI {self.split} answer accuracy: {self.checkpoint.name}", [bars],
            {"x": "bAbI task", "y": "answer accuracy"}, horizontal={f"all tasks: {result['accuracy']:.1%}": result["accuracy"]},
            ylim=(0, 1),
        )
        return TaskRecord(self.experiment, metrics, figure, details=details)

    def details(self) -> dict[str, Any]:
        return {"split": self.split}

    @property
    def budget_title(self) -> str:
        return f"catbAbI {self.split}: test-time compute"
