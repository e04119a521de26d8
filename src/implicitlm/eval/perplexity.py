"""The record of held-out perplexity by context length (the metric itself: ``tasks.lm``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .plots import plot_curves
from .records import make_record, write_record


def lm_length_record(
    model,
    checkpoint: str | Path,
    rows: list[dict[str, Any]],
    out_dir: str | Path,
    mode: str,
    train_length: int | None = None,
) -> dict[str, Any]:
    """Write the perplexity-by-context-length result (``lm_length.json`` + ``.png``)."""
    metrics = {f"perplexity@{row['length']}": row["perplexity"] for row in rows}
    curve = {"label": f"{mode} mode", "x": [r["length"] for r in rows], "y": [r["perplexity"] for r in rows]}
    axes = {"x": "context length (tokens)", "y": "perplexity", "xscale": "log2", "yscale": "log"}
    record = make_record(
        "lm_length", checkpoint, model, metrics, [curve], axes, mode=mode, train_length=train_length, rows=rows
    )
    write_record(out_dir, record)
    marks = {"training context": train_length} if train_length else {}
    plot_curves([curve], Path(out_dir) / "lm_length.png", "perplexity by context length", axes, vertical=marks)
    return record
