"""Timing and table helpers shared by the benchmark sections.

Every section measures its baseline in the same run as the thing it compares, and
reports medians of repeated runs, so the ratios hold on whatever machine runs them.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from implicitlm.core.atomic_io import atomic_write


@dataclass
class Table:
    """One section's result: a title, column names, rows and notes printed under it."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(cell) for cell in cells])

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |"]
        lines.append("|" + "---|" * len(self.columns))
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        lines += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines).rstrip() + "\n"

    def publish(self, out: Path | None) -> None:
        """Print the table; with ``out``, also write it there (atomically), for a study's record."""
        print(self.markdown())
        if out is not None:
            atomic_write(out, lambda temporary: temporary.write_text(self.markdown()))


def synchronize(device: str | torch.device) -> None:
    """Wait for the GPU's queued work, so that a timer measures it; nothing to wait for on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_seconds(run: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``run()`` over ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def first_and_median_seconds(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """The first call's seconds and the median of ``repeats`` calls after it: the first call
    compiles and tunes the kernels it meets, which is what a user's first call costs."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start, median_seconds(run, repeats, warmup=0)


@dataclass
class Paired:
    """Two runs timed in alternation: their median times and the median of the per-pair
    ratios candidate / baseline, which a slow drift of the machine's speed cancels out of."""

    baseline: float
    candidate: float
    ratio: float


def paired_median_seconds(
    baseline: Callable[[], object], candidate: Callable[[], object], repeats: int, warmup: int = 1
) -> Paired:
    """Time two runs in alternation, so a burst of load from elsewhere on the machine falls
    on both rather than on whichever happened to run during it."""
    for _ in range(warmup):
        baseline()
        candidate()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for run, spent in zip((baseline, candidate), times):
            start = time.perf_counter()
            run()
            spent.append(time.perf_counter() - start)
    ratios = [b / a for a, b in zip(*times)]
    return Paired(statistics.median(times[0]), statistics.median(times[1]), statistics.median(ratios))


def ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}x"


def verdict(passed: bool) -> str:
    return "met" if passed else "NOT met"
