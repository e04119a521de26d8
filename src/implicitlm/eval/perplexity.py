"""Held-out loss and perplexity of a causal language model, overall and by context length."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from tqdm.auto import tqdm

from ..data.shards import TokenShards, evaluation_windows
from ..deq import warn_not_converged
from ..models.loss import token_cross_entropy
from .plots import plot_curves
from .records import make_record, write_record


@torch.no_grad()
def perplexity(
    model,
    windows: Iterable[torch.Tensor],
    mode: str = "simultaneous",
    max_iter: int | None = None,
    tol: float | None = None,
    warn: bool = True,
) -> dict[str, float]:
    """Token-weighted mean loss and its exponential over ``windows`` ((b, L + 1) token
    batches: inputs are the first L tokens, each predicts the next), in evaluation mode
    with the evaluation budget unless ``max_iter`` / ``tol`` say otherwise. Implicit
    models also report the mean fixed-point iterations used (per sequence in simultaneous
    mode, per token in sequential mode) and how many fixed points stopped above the
    tolerance, and why; ``warn``: say so in one logged line when any did."""
    was_training = model.training
    model.eval()
    total_loss, total_tokens, iterations = 0.0, 0, []
    try:
        with model.track_convergence() as tally:
            for window in windows:
                window = window.to(model.device)
                output = model(window[:, :-1], mode=mode, max_iter=max_iter, tol=tol)
                targets = window[:, 1:]
                total_loss += token_cross_entropy(output.logits, targets, "aligned").item() * targets.numel()
                total_tokens += targets.numel()
                if output.fixed_point is not None:
                    iterations.append(output.fixed_point.iterations.float().flatten().cpu())
    finally:
        model.train(was_training)
    if total_tokens == 0:
        raise ValueError("no held-out tokens to evaluate")
    loss = total_loss / total_tokens
    result = {"loss": loss, "perplexity": math.exp(loss), "tokens": total_tokens}
    if iterations:
        result["fp_iterations_mean"] = torch.cat(iterations).mean().item()
        result.update(tally.as_dict())
        if warn:
            warn_not_converged(tally, f"perplexity ({mode} mode)")
    return result


def perplexity_by_length(
    model,
    shards: TokenShards,
    lengths: Iterable[int],
    batch_size: int,
    max_tokens: int | None = None,
    progress: bool = False,
    **budget: Any,
) -> list[dict[str, Any]]:
    """``perplexity`` with contexts of each length, on the split's leading windows.

    ``max_tokens`` caps the tokens scored per length; every length then reads (about) the
    same leading stretch of the split, so the lengths differ in context, not in text.
    """
    rows = []
    for length in tqdm(list(lengths), desc="eval", disable=not progress):
        windows = evaluation_windows(shards, length, batch_size)
        if max_tokens is not None:
            windows = _leading_windows(windows, max(1, max_tokens // length))
        rows.append({"length": length, **perplexity(model, windows, **budget)})
    return rows


def _leading_windows(batches: Iterator[torch.Tensor], count: int) -> Iterator[torch.Tensor]:
    for batch in batches:
        if count <= 0:
            return
        yield batch[:count]
        count -= len(batch)


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
