"""Simultaneous mode far beyond the training length: whole-sequence solve, chunked solve, RNN.

A whole-sequence solve carries a token's state about one position further per iteration,
so a word needs about as many iterations as it has tokens, each a pass over all of it; a
chunked solve (chunks of the training length, the state carried between them) converges
chunk by chunk as training did. Baseline in the same run: sequential (RNN) mode, each
token its own fixed point. The demo's S3 model is trained first, on the demo's schedule
(about a minute).
"""

from __future__ import annotations

import tempfile
import time

import torch
from common import Table

from implicitlm.presets import load_preset
from implicitlm.tasks.word_scoring import simultaneous_budget, word_predictions
from implicitlm.tasks.words import held_out_words
from implicitlm.models import ImplicitMamba2ForCausalLM, config_from_options
from implicitlm.train.config import TrainConfig
from implicitlm.train.trainer import train

MULTIPLE = 16


def trained_s3(quick: bool):
    """The demo's implicit model and schedule (quick: half the steps at half the batch)."""
    preset = load_preset("demo")
    settings = {**preset["train"], **preset["implicit_train"]}
    if quick:
        settings.update(batch_size=64, total_steps=settings["total_steps"] // 2, unroll_steps=settings["unroll_steps"] // 2)
    config = TrainConfig.for_task("words", **settings)
    torch.manual_seed(config.seed)
    model = ImplicitMamba2ForCausalLM(config_from_options({**preset["model"], "vocab_size": 6, "label_alignment": "aligned"}))
    with tempfile.TemporaryDirectory() as run:
        train(model, config, run, progress=False)
    return model.eval(), config


def run(quick: bool, device: str = "cpu") -> Table:
    model, config = trained_s3(quick)
    model.to(device)
    length = MULTIPLE * config.sequence_length
    inputs, targets = held_out_words(config.group, length, 16 if quick else 64, seed=1)
    table = Table(
        f"S3 words of {length} tokens ({MULTIPLE}x the training length), demo-size implicit Mamba2, {device}",
        ["solve", "budget", "s", "time / sequential", "passes", "last-10 accuracy", "agreement with sequential",
         "not converged"],
    )
    plain, anderson = "fixed_point_iter", "safeguarded_anderson"
    runs = {
        "sequential (RNN), baseline": ("sequential", 0, None, plain),
        f"chunked, {config.sequence_length} tokens (default)": ("simultaneous", config.sequence_length, None, plain),
        "whole sequence, model's budget": ("simultaneous", 0, model.solver.options.max_iter, plain),
        "whole sequence, budget 2L + 32": ("simultaneous", 0, None, plain),
        "sequential, safeguarded Anderson": ("sequential", 0, None, anderson),
        f"chunked, {config.sequence_length} tokens, safeguarded Anderson": ("simultaneous", config.sequence_length, None, anderson),
    }
    results = {}
    for name, (mode, chunk, max_iter, solver) in runs.items():
        solving = {"chunk_length": chunk, "solver": solver}
        budget = max_iter or (simultaneous_budget(model, length, solving) if mode == "simultaneous"
                              else model.solver.options.max_iter)
        start = time.perf_counter()
        predicted, row = word_predictions(model, inputs, targets, mode, budget, None, batch_size=256, warn=False,
                                          fixed_point=solving)
        results[name] = (budget, time.perf_counter() - start, row, predicted)
    baseline = results["sequential (RNN), baseline"]
    for name, (budget, seconds, row, predicted) in results.items():
        agreement = (predicted == baseline[3]).float().mean().item()
        table.add(
            name, budget, f"{seconds:.2f}", f"{seconds / baseline[1]:.2f}x", f"{row['fp_passes_mean']:.1f}",
            f"{row['accuracy_last10']:.2%}",
            f"{agreement:.2%}", f"{row['fp_not_converged_share']:.1%} of {row['fp_fixed_points']}",
        )
    table.notes.append("passes: per word in simultaneous mode (all its chunks), per token in sequential mode")
    table.notes.append(
        "not converged: samples (simultaneous; chunked: a sample any of whose chunks missed) or tokens (sequential) "
        f"above the tolerance {model.solver.options.tol:g}"
    )
    return table
