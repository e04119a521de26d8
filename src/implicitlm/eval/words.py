"""Word-problem accuracy by sequence length, in either inference mode: the demo's tables and
the ``word_length`` record (the metrics themselves: ``tasks.word_scoring``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from tqdm.auto import tqdm

from ..data.groups import get_group
from ..tasks.word_scoring import mode_agreement, word_accuracy
from ..tasks.words import held_out_words
from .plots import plot_accuracy_by_length
from .records import make_record, write_record


def accuracy_by_length(
    model,
    group: str,
    lengths: Iterable[int],
    count: int = 512,
    seed: int = 0,
    hard_prob: float | None = None,
    progress: bool = False,
    **kwargs,
) -> list[dict[str, Any]]:
    """``word_accuracy`` on fresh test words of each length."""
    return _by_length(word_accuracy, model, group, lengths, count, seed, hard_prob, progress, "eval", **kwargs)


def agreement_by_length(
    model,
    group: str,
    lengths: Iterable[int],
    count: int = 64,
    seed: int = 0,
    hard_prob: float | None = None,
    progress: bool = False,
    **budget,
) -> list[dict[str, Any]]:
    """``mode_agreement`` on fresh test words of each length."""
    return _by_length(mode_agreement, model, group, lengths, count, seed, hard_prob, progress, "duality", **budget)


def _by_length(evaluate, model, group, lengths, count, seed, hard_prob, progress, desc, **kwargs):
    return [
        evaluate(model, *held_out_words(group, length, count, seed, hard_prob), **kwargs)
        for length in tqdm(list(lengths), desc=desc, disable=not progress)
    ]


def word_length_record(
    model,
    checkpoint: str | Path,
    rows: list[dict[str, Any]],
    out_dir: str | Path,
    group: str,
    mode: str,
    train_length: int | None = None,
) -> dict[str, Any]:
    """Write the length-extrapolation result (``word_length.json`` + ``.png``) of ``rows``."""
    metrics = {f"accuracy_last10@{row['length']}": row["accuracy_last10"] for row in rows}
    metrics.update({f"accuracy@{row['length']}": row["accuracy"] for row in rows})
    curve = {"label": f"{mode} mode", "x": [r["length"] for r in rows], "y": [r["accuracy_last10"] for r in rows]}
    axes = {"x": "test sequence length", "y": "accuracy, last 10 tokens", "xscale": "log2"}
    record = make_record(
        "word_length", checkpoint, model, metrics, [curve], axes,
        group=group, mode=mode, train_length=train_length, rows=rows,
    )
    write_record(out_dir, record)
    plot_accuracy_by_length(
        {f"{mode} mode": rows}, Path(out_dir) / "word_length.png", f"{group} word problem: accuracy by length",
        train_length=train_length, chance=1.0 / get_group(group).order,
    )
    return record
