"""Word-problem accuracy by sequence length, in either inference mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.groups import get_group
from ..data.words import generate_words
from .plots import plot_accuracy_by_length
from .records import make_record, write_record

# Test words come from seeds far from any training step's seed sequence.
TEST_SEED_OFFSET = 1_000_000_007


def word_accuracy(
    model,
    inputs: np.ndarray,
    targets: np.ndarray,
    mode: str = "simultaneous",
    max_iter: int | None = None,
    tol: float | None = None,
    batch_size: int = 256,
    last: int = 10,
) -> dict[str, Any]:
    """Per-token accuracy over all tokens and over the last ``last`` tokens of each word,
    with the fixed-point statistics averaged over samples (implicit models)."""
    model.eval()
    device = next(model.parameters()).device
    correct, iterations, residuals = [], [], []
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            x = torch.from_numpy(inputs[start : start + batch_size].astype(np.int64)).to(device)
            y = torch.from_numpy(targets[start : start + batch_size].astype(np.int64)).to(device)
            output = model(x, mode=mode, max_iter=max_iter, tol=tol)
            correct.append((output.logits.argmax(-1) == y).cpu())
            if output.fixed_point is not None:
                iterations.append(output.fixed_point.iterations.float().cpu().flatten())
                residuals.append(output.fixed_point.rel_residual.cpu().flatten())
    hits = torch.cat(correct).float()
    result: dict[str, Any] = {
        "length": int(inputs.shape[1]),
        "sequences": int(inputs.shape[0]),
        "accuracy": hits.mean().item(),
        f"accuracy_last{last}": hits[:, -last:].mean().item(),
    }
    if iterations:
        result["fp_iterations_mean"] = torch.cat(iterations).mean().item()
        result["fp_rel_residual_mean"] = torch.cat(residuals).mean().item()
    return result


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
    """``word_accuracy`` on fresh test words of each length (seeded, disjoint from training)."""
    results = []
    for length in tqdm(list(lengths), desc="eval", disable=not progress):
        inputs, targets = generate_words(group, length, count, seed=TEST_SEED_OFFSET + seed, hard_prob=hard_prob)
        results.append(word_accuracy(model, inputs, targets, **kwargs))
    return results


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
    metrics = {f"accuracy@{row['length']}": row["accuracy"] for row in rows}
    curve = {"label": f"{mode} mode", "x": [r["length"] for r in rows], "y": [r["accuracy"] for r in rows]}
    axes = {"x": "test sequence length", "y": "per-token accuracy", "xscale": "log2"}
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
