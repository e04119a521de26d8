"""The one JSON layout every experiment writes, so that ``implicitlm report`` can gather runs.

A record is a dict::

    experiment   what was measured ("word_length", "lm_length", "jacobian", ...)
    checkpoint   the model folder it was measured on (or a preset name for random models)
    model        architecture, implicit or not, parameter count, dtype; for an implicit model the
                 fixed-point options it was measured with and the solver of each mode
    metrics      flat {name: number}: the figures a comparison table shows
    curves       optional [{"label", "x", "y"}]: the series a comparison figure overlays,
                 with ``axes`` {"x": label, "y": label, "xscale", "yscale"} naming them
    ...          any further detail of the experiment (rows, settings)

It is written as ``<out>/<experiment>.json`` beside a ``<out>/<experiment>.png`` figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.atomic_io import write_json

RECORD_KEYS = ("experiment", "checkpoint", "model", "metrics")


def model_summary(model) -> dict[str, Any]:
    config = model.config
    summary = {
        "architecture": config.model_type.removeprefix("implicit_"),
        "implicit": bool(config.implicit),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(model.dtype).removeprefix("torch."),
    }
    if config.implicit:
        options = model.solver.options
        summary["fixed_point"] = options.to_dict()
        summary["solvers"] = {mode: options.solver_for(mode) for mode in ("simultaneous", "sequential")}
    return summary


def make_record(
    experiment: str,
    checkpoint: str | Path,
    model,
    metrics: dict[str, float],
    curves: list[dict[str, Any]] | None = None,
    axes: dict[str, str] | None = None,
    **details: Any,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "experiment": experiment,
        "checkpoint": str(checkpoint),
        "model": model_summary(model),
        "metrics": {name: float(value) for name, value in metrics.items()},
    }
    if curves is not None:
        record["curves"] = curves
        record["axes"] = axes or {}
    record.update(details)
    return record


def write_record(out_dir: str | Path, record: dict[str, Any]) -> Path:
    path = Path(out_dir) / f"{record['experiment']}.json"
    write_json(path, record)
    return path


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The record in ``path``, or None for a JSON file that is not one (other outputs)."""
    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: unreadable result file ({error})") from None
    if not isinstance(value, dict) or not all(key in value for key in RECORD_KEYS):
        return None
    return value
