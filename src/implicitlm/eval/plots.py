"""PNG figures of evaluation results."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are written to files, never shown
import matplotlib.pyplot as plt  # noqa: E402

from ..atomic_io import atomic_write  # noqa: E402


def plot_accuracy_by_length(
    curves: dict[str, list[dict]],
    path: str | Path,
    title: str,
    train_length: int | None = None,
    chance: float | None = None,
) -> Path:
    """One line per model: per-token accuracy against test length."""
    figure, axis = plt.subplots(figsize=(6, 4))
    lengths = sorted({r["length"] for rows in curves.values() for r in rows})
    for name, rows in curves.items():
        axis.plot([r["length"] for r in rows], [r["accuracy"] for r in rows], marker="o", label=name)
    if train_length:
        axis.axvline(train_length, color="grey", linestyle=":", label="training length")
    if chance:
        axis.axhline(chance, color="grey", linestyle="--", linewidth=0.8, label="chance")
    axis.set_xscale("log", base=2)
    axis.set_xticks(lengths, [str(n) for n in lengths])
    axis.minorticks_off()
    axis.set_ylim(0, 1.02)
    axis.set_xlabel("test sequence length")
    axis.set_ylabel("per-token accuracy")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(loc="center right")
    figure.tight_layout()
    return save_figure(figure, path)


def save_figure(figure, path: str | Path) -> Path:
    """Write atomically (a temporary file renamed into place) and release the figure."""
    path = Path(path)
    try:
        atomic_write(path, lambda temporary: figure.savefig(temporary, dpi=120, format=path.suffix.lstrip(".") or "png"))
    finally:
        plt.close(figure)
    return path


def plot_learning_curves(
    curves: dict[str, list[tuple[float, float]]], path: str | Path, title: str, xlabel: str, ylabel: str
) -> Path:
    """One line per run: (x, y) points, e.g. (tokens seen, held-out perplexity)."""
    figure, axis = plt.subplots(figsize=(6, 4))
    for name, points in curves.items():
        axis.plot([x for x, _ in points], [y for _, y in points], marker=".", label=name)
    axis.set_yscale("log")
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3, which="both")
    axis.legend()
    figure.tight_layout()
    return save_figure(figure, path)
