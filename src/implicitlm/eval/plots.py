"""PNG figures of evaluation results."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # headless: figures are written to files, never shown
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

from ..core.atomic_io import atomic_write  # noqa: E402

if TYPE_CHECKING:  # read, never built, here: importing tasks/ would load torch into ``report``
    from ..tasks.base import Figure

# Reference lines, each unlike the others and unlike the data (solid, marked, in the colour
# cycle): a colour and a dash pattern of their own, the i-th line the i-th of each cycle, so
# that 12 lines pass before a pair repeats.
REFERENCE_COLOURS = ("black", "dimgrey", "saddlebrown")
REFERENCE_DASHES = (":", "--", "-.", (0, (5, 1, 1, 1, 1, 1)))


def plot_curves(
    curves: list[dict[str, Any]],
    path: str | Path,
    title: str,
    axes: dict[str, str],
    vertical: dict[str, float] | None = None,
    horizontal: dict[str, float] | None = None,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """Lines ``{"label", "x", "y"}`` on shared axes; ``axes`` names them and may set
    "xscale" / "yscale" ("linear", "log", or "log2": log axis ticked at the data's x values).
    ``vertical`` / ``horizontal``: labelled reference lines (training length, chance)."""
    figure, axis = plt.subplots(figsize=(6, 4))
    for curve in curves:
        axis.plot(curve["x"], curve["y"], marker="o", markersize=4, label=curve["label"])
    _reference_lines(axis, vertical, horizontal)
    _set_scale(axis, "x", axes.get("xscale", "linear"), sorted({x for c in curves for x in c["x"]}))
    _set_scale(axis, "y", axes.get("yscale", "linear"), [])
    if ylim:
        axis.set_ylim(*ylim)
    axis.grid(alpha=0.3, which="both")
    return _finish(figure, axis, path, title, axes, legend=bool(curves))


def plot_bars(figure: Figure, path: str | Path) -> Path:
    """A bar per x value (a category, shown as text) of each of ``figure``'s series
    ``{"label", "x", "y"}``, side by side where several share one; reference lines as
    ``plot_curves`` draws them."""
    series, ylim = figure.series, figure.ylim
    categories = list(dict.fromkeys(str(x) for bars in series for x in bars["x"]))
    width = 0.8 / max(len(series), 1)
    drawing, axis = plt.subplots(figsize=(7, 3.5))
    for i, bars in enumerate(series):
        positions = [categories.index(str(x)) + (i - (len(series) - 1) / 2) * width for x in bars["x"]]
        axis.bar(positions, bars["y"], width=width, label=bars["label"])
    axis.set_xticks(range(len(categories)), categories)
    _reference_lines(axis, figure.vertical, figure.horizontal)
    if ylim:
        # Headroom above the range for the legend, which would otherwise cover full bars.
        low, high = ylim
        axis.set_ylim(low, high + 0.15 * (high - low))
        axis.set_yticks(np.linspace(low, high, 6))
    axis.grid(alpha=0.3, axis="y")
    return _finish(drawing, axis, path, figure.title, figure.axes, legend=True)


def _plot_curves_figure(figure: Figure, path: str | Path) -> Path:
    return plot_curves(figure.series, path, figure.title, figure.axes, figure.vertical, figure.horizontal, figure.ylim)


# How each kind of a task's figure (``tasks.base.FIGURE_KINDS``) is drawn.
DRAW_FIGURE = {"curves": _plot_curves_figure, "bars": plot_bars}


def plot_figure(figure: Figure, path: str | Path) -> Path:
    """A task's figure, drawn by its kind; every kind takes the same description."""
    return DRAW_FIGURE[figure.kind](figure, path)


def _reference_lines(axis, vertical: dict[str, float] | None, horizontal: dict[str, float] | None) -> None:
    """Labelled lines at x values (the training length) and y values (chance, an explicit
    model's score), each in a style of its own (``REFERENCE_COLOURS``, ``REFERENCE_DASHES``)."""
    lines = [(axis.axvline, label, value) for label, value in (vertical or {}).items()]
    lines += [(axis.axhline, label, value) for label, value in (horizontal or {}).items()]
    for i, (draw, label, value) in enumerate(lines):
        draw(value, color=REFERENCE_COLOURS[i % len(REFERENCE_COLOURS)],
             linestyle=REFERENCE_DASHES[i % len(REFERENCE_DASHES)], linewidth=1.0, label=label)


def _set_scale(axis, which: str, scale: str, ticks: list[float]) -> None:
    if scale == "linear":
        return
    base = 2 if scale == "log2" else 10
    (axis.set_xscale if which == "x" else axis.set_yscale)("log", base=base)
    scaled = axis.xaxis if which == "x" else axis.yaxis
    # matplotlib writes 5x10^1 and 2^5 on a log axis; a reader wants 50 and 32.
    scaled.set_major_formatter(PlainLogFormatter(base))
    scaled.set_minor_formatter(PlainLogFormatter(base))
    if scale == "log2" and which == "x" and ticks:
        # Ticked at the data's values: the test lengths and budgets themselves.
        axis.set_xticks(ticks, [plain_number(t) for t in ticks])
        axis.minorticks_off()


def plain_number(value: float) -> str:
    """``value`` as digits, to 6 significant ones, never in powers: 50, 0.005, 1000000."""
    return np.format_float_positional(value, precision=6, fractional=False, trim="-")


class PlainLogFormatter(LogFormatter):
    """matplotlib's choice of which log-axis ticks to label (decades, and the ticks between
    them where a decade or less is shown), each label a plain number (``plain_number``)."""

    def __call__(self, x, pos=None) -> str:
        return plain_number(x) if super().__call__(x, pos) else ""


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
    series = [{"label": name, "x": [x for x, _ in points], "y": [y for _, y in points]} for name, points in curves.items()]
    return plot_curves(series, path, title, {"x": xlabel, "y": ylabel, "yscale": "log"})


def plot_metric_bars(runs: dict[str, dict[str, float]], path: str | Path, title: str) -> Path:
    """Grouped horizontal bars: a group per metric, a bar per run."""
    metrics = list(dict.fromkeys(name for values in runs.values() for name in values))
    height = 1.0 / (len(runs) + 1)
    figure, axis = plt.subplots(figsize=(7, 1.5 + 0.35 * len(metrics) * len(runs)))
    for i, (run, values) in enumerate(runs.items()):
        positions = [m + i * height for m in range(len(metrics))]
        axis.barh(positions, [values.get(name, 0.0) for name in metrics], height=height, label=run)
    axis.set_yticks([m + height * (len(runs) - 1) / 2 for m in range(len(metrics))], metrics, fontsize="small")
    axis.invert_yaxis()
    axis.set_title(title)
    axis.grid(alpha=0.3, axis="x")
    axis.legend(fontsize="small")
    figure.tight_layout()
    return save_figure(figure, path)


def plot_metric_panels(runs: dict[str, dict[str, float]], path: str | Path, title: str) -> Path:
    """A panel per metric, each on its own scale (accuracies, iteration counts and shares
    side by side), a bar per run that has the metric: a run without it (an explicit model's
    fixed-point statistics) gets no bar, rather than a zero."""
    metrics = list(dict.fromkeys(name for values in runs.values() for name in values))
    names = list(runs)
    figure, axes = plt.subplots(len(metrics), 1, figsize=(7, 0.6 + (0.45 + 0.3 * len(names)) * len(metrics)),
                                squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, metric in zip(axes[:, 0], metrics):
        shown = [name for name in names if runs[name].get(metric) is not None]
        axis.barh(range(len(shown)), [runs[name][metric] for name in shown],
                  color=[colours[names.index(name) % len(colours)] for name in shown])
        axis.set_yticks(range(len(shown)), shown, fontsize="small")
        axis.invert_yaxis()
        axis.set_title(metric, fontsize="small", loc="left")
        axis.grid(alpha=0.3, axis="x")
    figure.suptitle(title)
    figure.tight_layout()
    return save_figure(figure, path)


def plot_histograms(curves: list[dict[str, Any]], path: str | Path, title: str, axes: dict[str, str]) -> Path:
    """Side-by-side bars per x value, one colour per curve; log y, since the tail is the point."""
    width = 0.8 / max(len(curves), 1)
    figure, axis = plt.subplots(figsize=(7, 4))
    for i, curve in enumerate(curves):
        # Empty bins are left out: a log axis cannot show them, and they would stretch the x
        # axis to the budget however few passes the tokens took.
        shown = [(x, y) for x, y in zip(curve["x"], curve["y"]) if y > 0]
        positions = [x + (i - (len(curves) - 1) / 2) * width for x, _ in shown]
        axis.bar(positions, [y for _, y in shown], width=width, label=curve["label"])
    _set_scale(axis, "y", "log", [])
    axis.grid(alpha=0.3, axis="y")
    return _finish(figure, axis, path, title, axes, legend=bool(curves))


def _finish(figure, axis, path: str | Path, title: str, axes: dict[str, str], legend: bool) -> Path:
    """Axis labels, title and legend, then the figure written (``save_figure``)."""
    axis.set_xlabel(axes.get("x", ""))
    axis.set_ylabel(axes.get("y", ""))
    axis.set_title(title)
    if legend:
        axis.legend(fontsize="small")
    figure.tight_layout()
    return save_figure(figure, path)


def plot_heatmaps(
    panels: dict[str, Any], path: str | Path, title: str, axes_labels: dict[str, str], vmin: float, vmax: float
) -> Path:
    """Matrices side by side on one colour scale (values outside [vmin, vmax] take its ends);
    ``axes_labels`` names "x" (columns), "y" (rows) and "colorbar"."""
    figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels) + 1, 4.4), squeeze=False, layout="constrained")
    for axis, (name, values) in zip(axes[0], panels.items()):
        image = axis.imshow(values, vmin=vmin, vmax=vmax, cmap="viridis", interpolation="nearest")
        axis.set_title(name, fontsize="small")
        axis.set_xlabel(axes_labels.get("x", ""))
        axis.set_ylabel(axes_labels.get("y", ""))
    figure.colorbar(image, ax=axes[0].tolist(), label=axes_labels.get("colorbar", ""))
    figure.suptitle(title)
    return save_figure(figure, path)
