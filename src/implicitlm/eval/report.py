"""Comparison report: the records of several runs as Markdown tables and overlaid figures.

Each experiment command writes ``<experiment>.json`` records (see ``records``); a report
finds them under the given run folders, makes one table per experiment (a row per run,
a column per metric) and one figure per experiment that has curves, every run's curves
on the same axes.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..core.atomic_io import atomic_write
from ..core.errors import DataError, MissingFileError
from .plots import plot_curves, plot_metric_panels
from .records import claimed_outputs, read_record, record_files


# Wider tables do not read: longer curves (histograms) and longer metric lists are left to
# the figures and the JSON records.
MAX_COLUMNS = 12


@dataclass
class Entry:
    label: str
    path: Path
    record: dict[str, Any]


def find_records(run_dirs: Iterable[str | Path]) -> list[Entry]:
    """Every record under each run folder (or the record file given), labelled by its run."""
    entries = []
    for run in map(Path, run_dirs):
        if not run.exists():
            raise MissingFileError(f"{run}: no such run folder")
        files = [run] if run.is_file() else sorted(run.rglob("*.json"))
        found = [(path, record) for path in files if (record := read_record(path)) is not None]
        if not found:
            raise DataError(f"{run}: no experiment results (JSON records) found")
        per_experiment = collections.Counter(record["experiment"] for _, record in found)
        for path, record in found:
            # The run as named on the command line; the record's own folder where the run
            # holds several records of one experiment.
            label = path.parent if per_experiment[record["experiment"]] > 1 else run
            entries.append(Entry(str(label), path, record))
    return entries


def markdown_tables(entries: list[Entry]) -> str:
    """Per experiment: its curves as a table (a row per curve, a column per x value) where
    they are few points long, and its metrics (a column each) where they are few or there
    is no curve table."""
    sections = []
    for experiment, group in _by_experiment(entries).items():
        xs = sorted({x for entry in group for curve in entry.record.get("curves", []) for x in curve["x"]})
        tables = []
        if xs and len(xs) <= MAX_COLUMNS:
            tables.append(_curve_table(group, xs))
        if not tables or len({name for entry in group for name in entry.record["metrics"]}) <= MAX_COLUMNS:
            tables.append(_metric_table(group))
        sections.append(f"## {experiment}\n\n" + "\n\n".join(tables))
    return "\n\n".join(sections) + "\n"


def _metric_table(group: list[Entry]) -> str:
    metrics = list(dict.fromkeys(name for entry in group for name in entry.record["metrics"]))
    rows = [[*_run_cells(entry), *(_format(entry.record["metrics"].get(name)) for name in metrics)] for entry in group]
    return _table(["run", "model", "params (M)", *metrics], rows)


def _curve_table(group: list[Entry], xs: list[float]) -> str:
    axes = next(entry.record["axes"] for entry in group if "curves" in entry.record)
    rows = []
    for entry in group:
        for curve in entry.record.get("curves", []):
            values = dict(zip(curve["x"], curve["y"]))
            run, model, params = _run_cells(entry)
            rows.append([f"{run}: {curve['label']}", model, params, *(_format(values.get(x)) for x in xs)])
    caption = f"{axes.get('y', 'value')} by {axes.get('x', 'x')}\n\n"
    return caption + _table(["run", "model", "params (M)", *(f"{x:g}" for x in xs)], rows)


def _run_cells(entry: Entry) -> list[str]:
    model = entry.record["model"]
    kind = f"{'implicit' if model['implicit'] else 'explicit'} {model['architecture']}"
    return [entry.label, kind, f"{model['parameters'] / 1e6:.2f}"]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = [_row(header), _row(["---"] * len(header)), *map(_row, rows)]
    return "\n".join(lines)


def write_report(
    run_dirs: Iterable[str | Path], out_dir: str | Path, overwrite: bool = False
) -> tuple[Path, list[Path]]:
    """``report.md`` and one ``<experiment>.png`` per experiment in ``out_dir``; any of them
    already there (an evaluation's own figure, when ``out_dir`` is a run) is refused unless
    ``overwrite``."""
    entries = find_records(run_dirs)
    groups = _by_experiment(entries)
    report = Path(out_dir) / "report.md"
    with claimed_outputs([report, *(record_files(out_dir, experiment)[1] for experiment in groups)], overwrite):
        figures = [_figure(experiment, group, Path(out_dir)) for experiment, group in groups.items()]
        links = "\n".join(f"![{path.stem}]({path.name})" for path in figures)
        text = "# Comparison report\n\n" + markdown_tables(entries) + "\n" + links + "\n"
        atomic_write(report, lambda temporary: temporary.write_text(text))
    return report, figures


def _figure(experiment: str, group: list[Entry], out_dir: Path) -> Path:
    path = record_files(out_dir, experiment)[1]
    if any("curves" in entry.record for entry in group):
        curves = [
            {**curve, "label": f"{entry.label}: {curve['label']}"}
            for entry in group
            for curve in entry.record.get("curves", [])
        ]
        axes = next(entry.record["axes"] for entry in group if "curves" in entry.record)
        return plot_curves(curves, path, experiment, axes)
    return plot_metric_panels({entry.label: entry.record["metrics"] for entry in group}, path, experiment)


def _by_experiment(entries: list[Entry]) -> dict[str, list[Entry]]:
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.record["experiment"], []).append(entry)
    return groups


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _format(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.4g}"
