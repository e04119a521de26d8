"""Held-out perplexity during language-model training, and its curve as a record that
``implicitlm report`` overlays for several runs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from ..data.shards import TokenShards
from ..data.token_windows import evaluation_windows
from ..tasks.lm import perplexity
from ..eval.plots import plot_learning_curves
from ..eval.records import make_record, write_record
from .config import TrainConfig


def held_out_metrics(core, test: TokenShards, config: TrainConfig) -> dict[str, float]:
    windows = evaluation_windows(test, config.sequence_length, config.batch_size)
    # No warning at every evaluation: the share goes to the logs as test_fp_not_converged_share.
    result = perplexity(core, itertools.islice(windows, config.eval_batches), warn=False)
    held_out = {"test_loss": result["loss"], "test_ppl": result["perplexity"]}
    if "fp_not_converged_share" in result:
        held_out["test_fp_not_converged_share"] = result["fp_not_converged_share"]
    return held_out


def held_out_curve(run_dir: str | Path, tokens_per_step: int) -> list[tuple[int, float]]:
    """(training tokens, held-out perplexity) at each held-out evaluation a run logged."""
    points = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "test_ppl" in record:
            points.append(((record["step"] + 1) * tokens_per_step, record["test_ppl"]))
    return points


def write_training_record(core, out_dir: Path, config: TrainConfig, tokens_per_step: int, checkpoint: Path) -> None:
    """The held-out curve as a record (``lm_training.json`` + ``.png``); nothing for a run
    without held-out evaluations."""
    points = held_out_curve(out_dir, tokens_per_step)
    if not points:
        return
    tokens, ppl = [x for x, _ in points], [y for _, y in points]
    axes = {"x": "training tokens", "y": "held-out perplexity", "yscale": "log"}
    record = make_record(
        "lm_training", checkpoint, core, {"test_ppl": ppl[-1], "train_tokens": config.total_steps * tokens_per_step},
        curves=[{"label": "held-out perplexity", "x": tokens, "y": ppl}], axes=axes,
    )
    write_record(out_dir, record)
    plot_learning_curves({out_dir.name: points}, out_dir / "lm_training.png", "held-out perplexity", axes["x"], axes["y"])
