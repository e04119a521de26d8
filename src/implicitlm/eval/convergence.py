"""Per-token convergence in sequential (RNN) mode: how many passes each token needs.

The paper's claim: only a small subset of tokens needs the full budget. In sequential mode
every token has its own fixed point, so its count of passes is its own, and tokens can be
split by a mask (for A5 x M words: tokens whose group part is not the identity are hard).

A token short of the tolerance either spent the whole budget (unconverged) or was given
up earlier by the solve (diverged: its residual kept growing, or was not finite); its
count of passes tells which.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.errors import OptionError
from ..core.duration import require_time
from ..tasks.base import Task, forward_seconds
from .plots import plot_histograms
from .records import claimed_records, make_record, record_files, write_record

EXPERIMENT = "convergence"


@torch.no_grad()
def token_passes(
    model,
    inputs: np.ndarray,
    max_iter: int | None = None,
    tol: float | None = None,
    batch_size: int = 64,
    progress: bool = False,
    fixed_point: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Passes and residual (the stop mode's, which the tolerance applies to) of every
    token of ``inputs`` (N, L), solved in sequential mode with the model's solver, or as
    ``fixed_point`` changes its options, to the tolerance (whatever ``passes`` they declare:
    these are the solve's own figures); also the budget and tolerance that applied."""
    if not model.config.implicit:
        raise OptionError("convergence statistics need an implicit model; this one is explicit")
    model.eval()
    options = model.fixed_point_options(fixed_point)
    max_iter, tol = options.budget(max_iter, tol)
    passes, residuals = [], []
    for start in tqdm(range(0, len(inputs), batch_size), desc="sequential", disable=not progress):
        batch = torch.as_tensor(inputs[start : start + batch_size].astype(np.int64), device=model.device)
        stats = model(batch, mode="sequential", max_iter=max_iter, tol=tol, passes=0, fixed_point=options).fixed_point
        passes.append(stats.passes.cpu().numpy())
        # float64 holds every dtype's residual exactly: no rounding across the tolerance.
        residuals.append(stats.residual.double().cpu().numpy())
    return np.concatenate(passes), np.concatenate(residuals), max_iter, tol


def convergence_summary(
    passes: np.ndarray, residuals: np.ndarray, max_iter: int, tol: float, hard: np.ndarray | None = None
) -> dict[str, Any]:
    """Histogram and shares over all tokens, and over the ``hard`` / easy tokens if a mask is given."""
    summary = {"max_iter": max_iter, "tol": tol, "all": _describe(passes, residuals, max_iter, tol)}
    if hard is not None:
        if hard.shape != passes.shape:
            raise OptionError(f"hard-token mask of shape {hard.shape} for tokens of shape {passes.shape}")
        summary["hard_share"] = float(hard.mean())
        summary["hard"] = _describe(passes[hard], residuals[hard], max_iter, tol)
        summary["easy"] = _describe(passes[~hard], residuals[~hard], max_iter, tol)
    return summary


def _describe(passes: np.ndarray, residuals: np.ndarray, max_iter: int, tol: float) -> dict[str, Any]:
    if passes.size == 0:
        return {"tokens": 0}
    counts = np.bincount(passes.ravel(), minlength=max_iter + 1)[1:]
    missed = ~(residuals < tol)  # NaN included
    return {
        "tokens": int(passes.size),
        "passes_mean": float(passes.mean()),
        "passes_median": float(np.median(passes)),
        "passes_p90": float(np.percentile(passes, 90)),
        # Tokens that used every iteration allowed: they stopped at the budget, not the tolerance.
        "share_full_budget": float((passes >= max_iter).mean()),
        # Tokens short of the tolerance: after the whole budget, or given up before it.
        "share_unconverged": float(missed.mean()),
        "unconverged": int((missed & (passes >= max_iter)).sum()),
        "diverged": int((missed & (passes < max_iter)).sum()),
        "histogram": {"passes": list(range(1, max_iter + 1)), "tokens": counts.tolist()},
    }


def convergence_metrics(summary: dict[str, Any]) -> dict[str, float]:
    metrics = {}
    for group in ("all", "hard", "easy"):
        if group in summary and summary[group]["tokens"]:
            for name in ("passes_mean", "passes_median", "share_full_budget", "share_unconverged"):
                metrics[f"{group} {name}"] = summary[group][name]
            for name in ("unconverged", "diverged"):
                metrics[f"{group} {name}"] = float(summary[group][name])
    if "hard_share" in summary:
        metrics["hard token share"] = summary["hard_share"]
    return metrics


def convergence_curves(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The histograms of passes as shares of each group's tokens."""
    curves = []
    for group in ("all", "hard", "easy"):
        if group in summary and summary[group]["tokens"]:
            histogram = summary[group]["histogram"]
            total = summary[group]["tokens"]
            curves.append({"label": f"{group} tokens", "x": histogram["passes"], "y": [c / total for c in histogram["tokens"]]})
    return curves


def convergence_record(
    model, checkpoint: str | Path, summary: dict[str, Any], out_dir: str | Path, title: str,
    fixed_point: dict[str, Any] | None = None, **details: Any
) -> dict[str, Any]:
    """Write ``convergence.json`` and the histogram of passes ``convergence.png``; the
    record names the solver that produced the counts (the model's, or as ``fixed_point`` set it)."""
    axes = {"x": "passes to reach the tolerance", "y": "share of tokens", "yscale": "log"}
    curves = convergence_curves(summary)
    record = make_record(
        EXPERIMENT, checkpoint, model, convergence_metrics(summary), curves, axes, fixed_point,
        summary=summary, solver=model.fixed_point_options(fixed_point).solver_for("sequential"), **details,
    )
    write_record(out_dir, record)
    plot_histograms(curves, record_files(out_dir, EXPERIMENT)[1], title, axes)
    return record


def convergence_by_task(
    task: Task,
    out: str | Path = ".",
    progress: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Per-token passes of an implicit checkpoint on ``task``'s convergence inputs, in
    sequential mode, solved as the task's ``fixed_point`` settings say (by default the
    model's budget), split into hard and easy tokens where the task marks them. Returns
    the ``summary``, the printed ``table`` and the ``files`` written in ``out``
    (``convergence.json`` and its histogram; a record already there is refused, before the
    solves, unless ``overwrite``)."""
    with claimed_records(out, [EXPERIMENT], overwrite):
        model, inputs = task.prepare("convergence")
        # At least one pass per token, as token_passes reads them: in batches, in sequential mode.
        seconds = sum(forward_seconds(model, "sequential", min(task.batch_size, len(tokens)), tokens.shape[1],
                                      -(-len(tokens) // task.batch_size), task.fixed_point) for tokens, _ in inputs)
        require_time(f"convergence statistics of {sum(tokens.size for tokens, _ in inputs):,} tokens", seconds,
                     hint="; give shorter lengths, fewer words or tokens")
        passes, residuals, hard = [], [], []
        for tokens, mask in inputs:
            counts, residual, used_max_iter, used_tol = token_passes(
                model, tokens, batch_size=task.batch_size, progress=progress, fixed_point=task.fixed_point
            )
            passes.append(counts.ravel()), residuals.append(residual.ravel()), hard.append(mask)
        masks = None if any(mask is None for mask in hard) else np.concatenate([mask.ravel() for mask in hard])
        summary = convergence_summary(
            np.concatenate(passes), np.concatenate(residuals), used_max_iter, used_tol, masks
        )
        convergence_record(model, task.checkpoint, summary, out, task.convergence_title, task.fixed_point,
                           **task.details())
    return {"summary": summary, "table": format_convergence(summary), "files": record_files(out, EXPERIMENT)}


def format_convergence(summary: dict[str, Any]) -> str:
    """The budget and tolerance, then a line per token group (all, hard, easy) that has tokens."""
    lines = [f"budget {summary['max_iter']}, tolerance {summary['tol']:g}"]
    # unconverged / diverged: token counts short of the tolerance, after the whole budget / given up before it.
    lines.append(f"{'tokens':<8}{'count':>9}{'mean':>8}{'median':>8}{'p90':>7}{'full budget':>13}{'unconverged':>13}"
                 f"{'diverged':>10}")
    for group in ("all", "hard", "easy"):
        stats = summary.get(group)
        if stats and stats["tokens"]:
            lines.append(
                f"{group:<8}{stats['tokens']:>9,}{stats['passes_mean']:>8.2f}{stats['passes_median']:>8.1f}"
                f"{stats['passes_p90']:>7.1f}{stats['share_full_budget']:>13.1%}{stats['unconverged']:>13,}"
                f"{stats['diverged']:>10,}"
            )
    return "\n".join(lines)
