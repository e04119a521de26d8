"""The catbAbI record: ``catbabi.json`` and its per-task figure (the scoring itself:
``tasks.catbabi``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from .plots import save_figure
from .records import make_record, write_record

EXPERIMENT = "catbabi"


def write_catbabi_results(
    out_dir: str | os.PathLike, checkpoint: str | os.PathLike, model, result: dict[str, Any], **settings: Any
) -> dict[str, Any]:
    """Write ``<out>/catbabi.json`` (a record; metrics: accuracy, task_01 ...) and
    ``<out>/catbabi.png`` (per-task accuracy); returns the record."""
    metrics = {"accuracy": result["accuracy"]}
    metrics.update({f"task_{task:02d}": row["accuracy"] for task, row in result["tasks"].items()})
    for key in ("fp_iterations_mean", "fp_not_converged_share"):
        if key in result:
            metrics[key] = result[key]
    details = {key: result[key] for key in ("answers", "stride", "windows")}
    details["tasks"] = {str(task): row for task, row in result["tasks"].items()}
    record = make_record(EXPERIMENT, checkpoint, model, metrics, **details, **settings)
    write_record(out_dir, record)
    title = f"catbAbI {settings.get('split', '')} answer accuracy: {Path(checkpoint).name}"
    plot_task_accuracy(result, Path(out_dir) / f"{EXPERIMENT}.png", title)
    return record


def plot_task_accuracy(result: dict[str, Any], path: str | os.PathLike, title: str) -> Path:
    """A bar per task, with the overall accuracy as a line."""
    tasks = sorted(result["tasks"])
    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.bar([str(task) for task in tasks], [result["tasks"][task]["accuracy"] for task in tasks])
    axis.axhline(result["accuracy"], color="grey", linestyle="--", label=f"all tasks: {result['accuracy']:.1%}")
    axis.set_ylim(0, 1.15)  # headroom for the legend above full bars
    axis.set_yticks(np.linspace(0, 1, 6))
    axis.set_xlabel("bAbI task")
    axis.set_ylabel("answer accuracy")
    axis.set_title(title)
    axis.grid(alpha=0.3, axis="y")
    axis.legend(fontsize="small")
    figure.tight_layout()
    return save_figure(figure, path)
