"""Word-problem accuracy by sequence length, in either inference mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.groups import get_group
from ..data.words import generate_words
from ..deq import warn_not_converged
from ..models.implicit_lm import MODES
from .plots import plot_accuracy_by_length
from .records import make_record, write_record

# Test words come from seeds far from any training step's seed sequence.
TEST_SEED_OFFSET = 1_000_000_007


# Simultaneous mode carries a token's state about one position further per iteration, so
# a word's fixed point takes about as many iterations as it has tokens; the slowest words
# of a trained S3 model took up to 1.5 times that (186 on average at 128 tokens, up to
# 250), hence twice the length plus a margin.
SIMULTANEOUS_BUDGET_PER_TOKEN = 2
SIMULTANEOUS_BUDGET_MARGIN = 32


def simultaneous_budget(model, length: int) -> int:
    """The evaluation budget of a simultaneous solve over words of ``length`` tokens: the
    model's own, or twice the length plus a margin where that is more; a model that solves
    in chunks (``eval_chunk_length``) needs that for a chunk's length only. Converged words
    stop early, so a generous budget costs only where it is needed."""
    return max(
        model.solver.options.eval_f_max_iter,
        SIMULTANEOUS_BUDGET_PER_TOKEN * solved_at_once(model, length) + SIMULTANEOUS_BUDGET_MARGIN,
    )


def solved_at_once(model, length: int) -> int:
    """How many tokens of a ``length``-token word one simultaneous solve takes: a chunk's worth."""
    return min(length, model.solver.options.eval_chunk_length or length)


def word_accuracy(
    model,
    inputs: np.ndarray,
    targets: np.ndarray,
    mode: str = "simultaneous",
    max_iter: int | None = None,
    tol: float | None = None,
    batch_size: int = 256,
    last: int = 10,
    warn: bool = True,
) -> dict[str, Any]:
    """Per-token accuracy over the last ``last`` tokens of each word (the authors' metric)
    and over all tokens but the first, whose label is its own input (a model that copies it
    would score 1 / length for free); for implicit models, the fixed-point iterations and
    how many fixed points stopped above the tolerance, and why.

    Budget: ``max_iter`` if given; else in simultaneous mode ``simultaneous_budget`` (it
    grows with the length), in sequential mode the model's per-token evaluation budget.
    ``warn``: log a one-line warning when fixed points stopped above the tolerance (a
    budget sweep, which shows the share itself, turns it off)."""
    return word_predictions(model, inputs, targets, mode, max_iter, tol, batch_size, last, warn)[1]


def mode_agreement(
    model,
    inputs: np.ndarray,
    targets: np.ndarray,
    max_iter: int | None = None,
    tol: float | None = None,
    batch_size: int = 256,
) -> dict[str, Any]:
    """The duality check: both inference modes of an implicit model on the same words.

    ``argmax_agreement``: the share of tokens whose predicted label is the same in
    simultaneous and in sequential (RNN) mode; ``simultaneous`` / ``sequential``: each
    mode's ``word_accuracy`` row. ``max_iter``: the budget of both (default: each mode's own)."""
    predictions, rows = {}, {}
    for mode in MODES:
        predictions[mode], rows[mode] = word_predictions(model, inputs, targets, mode, max_iter, tol, batch_size)
    agreement = (predictions["simultaneous"] == predictions["sequential"]).float().mean().item()
    return {"length": int(inputs.shape[1]), "sequences": int(inputs.shape[0]), "argmax_agreement": agreement, **rows}


def word_predictions(
    model, inputs, targets, mode: str, max_iter, tol, batch_size: int, last: int = 10, warn: bool = True
) -> tuple[torch.Tensor, dict[str, Any]]:
    """(predicted labels (N, L), ``word_accuracy``'s row): the predictions too, for
    comparisons between solves."""
    length = int(inputs.shape[1])
    if length < 2:
        raise ValueError("word accuracy needs words of at least 2 tokens: token 1's label is its input")
    if max_iter is None and mode == "simultaneous" and model.config.implicit:
        max_iter = simultaneous_budget(model, length)
    model.eval()
    device = next(model.parameters()).device
    predictions, correct, iterations, residuals = [], [], [], []
    with torch.no_grad(), model.track_convergence() as tally:
        for start in range(0, len(inputs), batch_size):
            x = torch.from_numpy(inputs[start : start + batch_size].astype(np.int64)).to(device)
            # Sliced per batch: targets may be derived from the inputs as they are read.
            y = torch.from_numpy(targets[start : start + batch_size].astype(np.int64))
            output = model(x, mode=mode, max_iter=max_iter, tol=tol)
            predictions.append(output.logits.argmax(-1).cpu())
            correct.append(predictions[-1] == y)
            if output.fixed_point is not None:
                iterations.append(output.fixed_point.iterations.float().cpu().flatten())
                residuals.append(output.fixed_point.rel_residual.cpu().flatten())
    predicted = torch.cat(predictions)
    hits = torch.cat(correct)[:, 1:].float()
    row: dict[str, Any] = {
        "length": length,
        "sequences": int(inputs.shape[0]),
        f"accuracy_last{last}": hits[:, -last:].mean().item(),
        "accuracy": hits.mean().item(),
    }
    if iterations:
        options = model.solver.options
        row["fp_max_iter"] = options.eval_f_max_iter if max_iter is None else max_iter
        row["fp_tol"] = options.eval_f_tol if tol is None else tol
        if mode == "simultaneous":
            row["fp_chunk_length"] = solved_at_once(model, length)
        row["fp_iterations_mean"] = torch.cat(iterations).mean().item()
        row["fp_rel_residual_mean"] = torch.cat(residuals).mean().item()
        row.update(tally.as_dict())
        if warn:
            warn_not_converged(tally, f"{mode} mode, length {length}")
    return predicted, row


def held_out_words(group: str, length: int, count: int, seed: int = 0, hard_prob: float | None = None):
    """(inputs, targets) of fresh test words, seeded far from any training step's seeds."""
    return generate_words(group, length, count, seed=TEST_SEED_OFFSET + seed, hard_prob=hard_prob)


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
