"""Test-time compute: quality as a function of the evaluation's budget of passes and tolerance.

An implicit model's depth is its number of passes per solve, chosen at evaluation
time. A sweep re-evaluates the same data at each budget (``max_iter``) and tolerance and
keeps, beside the quality, the passes the model actually used: with a tolerance, a
larger budget is only spent where tokens have not yet converged. A sweep over ``passes`` instead
runs exactly K passes per solve at each point, and sets the quality, the seconds it took and
the FLOPs per token beside those of explicit models on the same data (its explicit twin, deeper
ones) and of its own fixed point: what a pass buys and what it costs, the compute frontier.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tqdm.auto import tqdm

from ..core.errors import OptionError
from ..tasks.base import Task, missed_cell, missed_header, retries_cell
from .flops import flops_per_token, solved_flops_per_token
from .plots import plot_curves
from .records import claimed_outputs, claimed_records, make_record, record_files, write_record

# evaluate(max_iter, tol) -> one row per test length, each with a "length" key.
# The "passes" of a passes sweep's row of the implicit model solved to its tolerance.
SOLVED = "fixed point"
Evaluate = Callable[[int, "float | None"], list[dict[str, Any]]]


def budget_sweep(
    evaluate: Evaluate,
    budgets: Iterable[int],
    tols: Sequence[float | None] = (None,),
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Rows of ``evaluate`` at every (tolerance, budget), each tagged with both."""
    budgets = sorted(set(budgets))
    if not budgets or budgets[0] < 1:
        raise OptionError(f"budgets must be positive counts of passes, got {budgets}")
    grid = [(tol, budget) for tol in tols for budget in budgets]
    rows = []
    for tol, budget in tqdm(grid, desc="budgets", disable=not progress):
        rows += [{**row, "max_iter": budget, "tol": tol} for row in evaluate(budget, tol)]
    return rows


def budget_curves(rows: list[dict[str, Any]], quality: str) -> list[dict[str, Any]]:
    """One curve per test length (and tolerance, if several): ``quality`` against budget."""
    several_tols = len({row["tol"] for row in rows}) > 1
    curves: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        key = (row["length"], row["tol"])
        label = f"length {row['length']}" + (f", tol {row['tol']:g}" if several_tols else "")
        curve = curves.setdefault(key, {"label": label, "x": [], "y": []})
        curve["x"].append(row["max_iter"])
        curve["y"].append(row[quality])
    return list(curves.values())


def budget_metrics(rows: list[dict[str, Any]], quality: str) -> dict[str, float]:
    """Flat metrics for a comparison table: quality and passes used at each point."""
    several_tols = len({row["tol"] for row in rows}) > 1
    metrics = {}
    for row in rows:
        point = f"L{row['length']} it{row['max_iter']}" + (f" tol{row['tol']:g}" if several_tols else "")
        metrics[f"{quality} {point}"] = row[quality]
        if "fp_passes_mean" in row:
            metrics[f"passes {point}"] = row["fp_passes_mean"]
    return metrics


def budget_record(
    experiment: str,
    model,
    checkpoint: str | Path,
    rows: list[dict[str, Any]],
    quality: str,
    out_dir: str | Path,
    title: str,
    quality_scale: str = "linear",
    **details: Any,
) -> dict[str, Any]:
    """Write a sweep's ``<experiment>.json`` and its figure: ``quality`` (on a ``quality_scale``
    axis) against budget, a curve per test length."""
    axes = {"x": "budget of passes (max_iter)", "y": quality, "xscale": "log2", "yscale": quality_scale}
    curves = budget_curves(rows, quality)
    record = make_record(experiment, checkpoint, model, budget_metrics(rows, quality), curves, axes, rows=rows, **details)
    write_record(out_dir, record)
    plot_curves(curves, Path(out_dir) / f"{experiment}.png", title, axes)
    return record


def budget_by_task(
    task: Task,
    max_iter: Iterable[int],
    tol: Sequence[float | None] = (None,),
    mode: str = "simultaneous",
    out: str | Path = ".",
    progress: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """The sweep of ``task``'s test sets on an implicit checkpoint over every budget in
    ``max_iter`` and tolerance in ``tol`` (None: the model's), the task's other
    ``fixed_point`` settings held: its ``rows``, the printed ``table`` and the ``files``
    written in ``out`` (``<task.budget_experiment>.json`` and its figure: the task's
    ``quality`` against the budget, a curve per test length; a record already there is
    refused, before the sweep, unless ``overwrite``)."""
    with claimed_records(out, [task.budget_experiment], overwrite):
        model, test_sets = task.prepare("budget")
        max_iter = list(max_iter)
        points = len(set(max_iter)) * len(tol or [None])
        # A solve to the tolerance may stop after one pass, whatever its budget.
        task.require_sweep_time(model, test_sets, mode, _sweep(points, test_sets), [1] * points,
                                arguments=("max_iter", "tol"), hint="; give fewer budgets or tolerances")
        model_tol = model.fixed_point_options(task.fixed_point).tol

        def evaluate(budget, tolerance):
            # Each point of the sweep is a budget its forwards are given, in both modes, to the
            # tolerance (a checkpoint's declared passes would make every point the same).
            point = {"max_iter": budget, "simultaneous_max_iter": 0, "passes": 0,
                     "tol": model_tol if tolerance is None else tolerance}
            return [task.evaluate(model, s, mode=mode, fixed_point=point, warn=False) for s in test_sets]

        rows = budget_sweep(evaluate, max_iter, tol or [None], progress=progress)
        title = f"{task.budget_title} ({mode} mode)"
        budget_record(task.budget_experiment, model, task.checkpoint, rows, task.quality, out, title,
                      task.quality_scale, fixed_point=task.fixed_point, mode=mode, **task.details())
    files = record_files(out, task.budget_experiment)
    return {"rows": rows, "table": format_budget_table(rows, task.quality), "files": files}


def passes_by_task(
    task: Task,
    passes: Iterable[int],
    explicit: Sequence[Task] = (),
    mode: str = "simultaneous",
    out: str | Path = ".",
    progress: bool = False,
    overwrite: bool = False,
    solved: bool = False,
) -> dict[str, Any]:
    """The sweep of ``task``'s test sets on an implicit checkpoint at exactly K passes per solve
    for every K in ``passes`` (from its learned guess where it starts from one), with ``solved``
    its fixed point too (solved to its tolerance, ``passes`` "fixed point"), and the same test
    sets scored by each explicit model of ``explicit`` (tasks of the same kind on other
    checkpoints): the ``rows`` (each with its ``seconds`` and ``flops_per_token``; an explicit
    one's ``passes`` is its name), the printed ``table`` and the ``files`` written in ``out``
    (``<task.budget_experiment>_passes.json`` and its figure, the quality against the passes, a
    curve per test length, each explicit model's and the fixed point's a line per length;
    beside them ``_time.png`` and ``_flops.png``, the quality against the seconds and the FLOPs
    per token: the frontier)."""
    experiment = f"{task.budget_experiment}_passes"
    files = record_files(out, experiment)
    by_cost = {x: Path(out) / f"{experiment}_{name}.png" for x, name in (("seconds", "time"), ("flops_per_token", "flops"))}
    with claimed_outputs([*files, *by_cost.values()], overwrite):
        model, test_sets = task.prepare("budget")
        passes = sorted(set(passes))
        # Each explicit model's forward is one pass, as the implicit one's at K = 1; a solve to
        # the tolerance, at least one.
        points = passes + [1] * (len(explicit) + solved)
        task.require_sweep_time(model, test_sets, mode, _sweep(len(points), test_sets), points, arguments=("passes",),
                                hint="; give fewer passes")
        settings = task.settings()
        rows = []
        for count in tqdm(passes, desc="passes", disable=not progress):
            rows += [{**row, "passes": count,
                      "flops_per_token": flops_per_token(model, mode, row["length"], {**settings, "passes": count})}
                     for row in _timed(task, model, test_sets, mode, {"passes": count})]
        others = [{**row, "passes": SOLVED, "flops_per_token": solved_flops_per_token(
                      model, mode, row["length"], settings, row["fp_passes_mean"])}
                  for row in (_timed(task, model, test_sets, mode, {"passes": 0}) if solved else [])]
        for twin in explicit:
            twin_model = twin.load()
            others += [{**row, "passes": twin.checkpoint.name,
                        "flops_per_token": flops_per_token(twin_model, mode, row["length"], twin.settings())}
                       for row in _timed(twin, twin_model, test_sets, mode)]
        quality = task.quality
        curves = [{"label": f"length {length}", "x": [r["passes"] for r in points], "y": [r[quality] for r in points]}
                  for length, points in by_length(rows).items()]
        lines = {f"{row['passes']}{'' if row['passes'] == SOLVED else ' (one pass)'}, length {row['length']}: "
                 f"{row[quality]:.4g}": row[quality] for row in others}
        metrics = {f"{name} L{row['length']} {row['passes']}": row[key] for row in rows + others
                   for name, key in ((quality, quality), ("seconds", "seconds"), ("flops_per_token", "flops_per_token"))}
        axes = {"x": "passes per solve", "y": quality, "xscale": "log2", "yscale": task.quality_scale}
        record = make_record(experiment, task.checkpoint, model, metrics, curves, axes, task.fixed_point, rows=rows,
                             explicit=[row for row in others if row["passes"] != SOLVED],
                             solved=[row for row in others if row["passes"] == SOLVED],
                             mode=mode, **task.details())
        write_record(out, record)
        plot_curves(curves, files[1], f"{task.budget_title} in passes ({mode} mode)", axes,
                    horizontal=lines)
        for x, what in (("seconds", "seconds per evaluation"), ("flops_per_token", "FLOPs per token")):
            plot_curves(cost_curves(rows, others, quality, x), by_cost[x],
                        f"{task.budget_title} against {'time' if x == 'seconds' else 'FLOPs'} ({mode} mode)",
                        {"x": what, "y": quality, "xscale": "log", "yscale": task.quality_scale})
    return {"rows": rows + others, "table": format_passes_table(rows + others, quality), "files": files}


def _sweep(points: int, test_sets: list[Any]) -> str:
    return f"a sweep of {points:,} points over {len(test_sets)} test set{'s' * (len(test_sets) != 1)}"


def cost_curves(rows: list[dict[str, Any]], others: list[dict[str, Any]], quality: str, cost: str = "seconds"
                ) -> list[dict[str, Any]]:
    """The price of quality: the implicit model's points (one per K) and each of ``others``'
    one point (an explicit model, the fixed point), ``quality`` against ``cost`` (the seconds
    each evaluation took, or its FLOPs per token), a curve per test length."""
    curves = []
    for length, points in by_length(rows).items():
        passes = ", ".join(str(row["passes"]) for row in points)
        curves.append({"label": f"implicit, {passes} passes, length {length}", "x": [r[cost] for r in points],
                       "y": [r[quality] for r in points]})
        curves += [{"label": f"{row['passes']}, length {length}", "x": [row[cost]], "y": [row[quality]]}
                   for row in others if row["length"] == length]
    return curves


def by_length(rows: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """The rows of each test length, in the order the lengths first come."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["length"], []).append(row)
    return groups


def _timed(task: Task, model, test_sets: list[Any], mode: str,
           fixed_point: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``task``'s row on each test set (its forwards given ``Task.settings(fixed_point)``), with
    the ``seconds`` its evaluation took."""
    rows = []
    for test_set in test_sets:
        began = time.perf_counter()
        row = task.evaluate(model, test_set, mode=mode, fixed_point=fixed_point, warn=False)
        rows.append({**row, "seconds": time.perf_counter() - began})
    return rows


def format_passes_table(rows: list[dict[str, Any]], quality: str) -> str:
    """A line per (test length, passes, the fixed point or explicit model): ``quality``, seconds,
    FLOPs per token, the mean residual of the answers' last pass or the share of the fixed point's
    solves above the tolerance ("-": an explicit model)."""
    width = max(12, len(quality) + 2)
    name_width = max(len("passes"), *(len(str(row["passes"])) for row in rows)) + 2
    lines = [f"{'length':>8}{'passes':>{name_width}}{quality:>{width}}{'seconds':>10}{'FLOP/token':>12}"
             f"{missed_header(rows)}"]
    for row in rows:
        flops = f"{row['flops_per_token']:>12.3e}" if "flops_per_token" in row else f"{'-':>12}"
        lines.append(f"{row['length']:>8}{str(row['passes']):>{name_width}}{row[quality]:>{width}.4f}{row['seconds']:>10.2f}"
                     f"{flops}{missed_cell(row)}")
    return "\n".join(lines)


def format_budget_table(rows: list[dict[str, Any]], quality: str) -> str:
    """A line per (test length, tolerance, budget): ``quality``, the passes used (of which
    retries), the misses."""
    width = max(12, len(quality) + 2)
    lines = [f"{'length':>8}{'tol':>9}{'max_iter':>10}{quality:>{width}}{'passes used':>12}{'retries':>9}"
             f"{missed_header(rows)}"]
    for row in rows:
        tol = "model" if row["tol"] is None else f"{row['tol']:g}"
        used = f"{row['fp_passes_mean']:>12.2f}" if "fp_passes_mean" in row else f"{'-':>12}"
        lines.append(f"{row['length']:>8}{tol:>9}{row['max_iter']:>10}{row[quality]:>{width}.4f}{used}"
                     f"{retries_cell(row)}{missed_cell(row)}")
    return "\n".join(lines)
