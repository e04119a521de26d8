"""Fixed-point solvers: passes and wall time to reach a tolerance, in both modes.

Each solver solves the same batch to a relative residual of 1e-4, in simultaneous mode
(one fixed point per sequence) and in sequential mode (one per token); plain iteration
(``fixed_point_iter``) is the baseline. The model: the checkpoint named by
``IMPLICITLM_BENCH_CHECKPOINT`` (e.g. ``implicit/checkpoint`` of ``scripts/demo.sh``),
else a random implicit Mamba2 of the ``demo`` preset made to contract slowly (see the
note in the table), since training one here would take minutes.
"""

from __future__ import annotations

import os

import torch
from common import Table, median_seconds, ratio, synchronize, verdict

from implicitlm.presets import load_preset
from implicitlm.deq.options import SOLVERS
from implicitlm.models import build_model, config_from_options, load_model

BASELINE = "fixed_point_iter"
TOL = 1e-4
BUDGET = 500  # far beyond what any solver needs here: every solve ends at the tolerance
TARGET = 2.0  # times fewer row passes than plain iteration
CONTRACTION_SCALE = 0.3  # weight-norm scale of in_proj / out_proj in the random model


def load_or_build(device: str) -> tuple[torch.nn.Module, str]:
    """The benchmark checkpoint, or a random demo-preset model; with a line saying which."""
    checkpoint = os.environ.get("IMPLICITLM_BENCH_CHECKPOINT")
    if checkpoint:
        model = load_model(checkpoint)
        if not model.config.implicit:
            raise ValueError(f"IMPLICITLM_BENCH_CHECKPOINT={checkpoint}: an explicit model has no fixed point")
        return model.to(device).eval(), f"checkpoint {checkpoint}"
    torch.manual_seed(0)
    options = dict(load_preset("demo")["model"], architecture="mamba2", vocab_size=6, implicit=True)
    model = build_model(config_from_options(options))
    with torch.no_grad():
        for layer in model.stack.layers:
            for linear in (layer.mixer.in_proj, layer.mixer.out_proj):
                linear.parametrizations.weight.original0.mul_(CONTRACTION_SCALE)
    return model.to(device).eval(), (
        f"random implicit Mamba2 of the demo preset (d_model 64, 1 layer), in_proj and out_proj "
        f"weight-norm scales x{CONTRACTION_SCALE}: the residual of plain iteration then shrinks by "
        f"about 0.91 per step (measured), so it needs ~60 steps for {TOL:g} and an accelerated solver "
        "has room to show; set IMPLICITLM_BENCH_CHECKPOINT to measure a trained model instead"
    )


@torch.no_grad()
def measure(model, ids: torch.Tensor, solver: str, mode: str, repeats: int, device: str):
    """(stats of the solve, median seconds)."""
    outputs = []

    def solve() -> None:
        outputs.append(model(ids, mode=mode, max_iter=BUDGET, tol=TOL, fixed_point={"solver": solver}).fixed_point)
        synchronize(device)

    seconds = median_seconds(solve, repeats)
    return outputs[-1], seconds


def run(quick: bool, device: str = "cpu") -> Table:
    batch, length, repeats = (8, 24, 3) if quick else (32, 64, 5)
    model, source = load_or_build(device)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    table = Table(
        f"Fixed-point solvers to rel. residual {TOL:g}, batch {batch} x {length} tokens, {device}",
        ["mode", "solver", "batch passes", "row passes", "converged", "time (s)",
         "row passes / plain", "time / plain", f">= {TARGET:g}x fewer row passes"],
    )
    for mode in ("simultaneous", "sequential"):
        plain, plain_seconds = measure(model, ids, BASELINE, mode, repeats, device)
        add_row(table, mode, BASELINE, plain, plain_seconds, plain, plain_seconds)
        for solver in (name for name in SOLVERS if name != BASELINE):
            stats, seconds = measure(model, ids, solver, mode, repeats, device)
            add_row(table, mode, solver, stats, seconds, plain, plain_seconds)
    # ``plain`` is now sequential mode's: what leaving frozen samples out of the steps saved.
    every_row = batch * plain.batch_passes
    table.notes += [
        f"model: {source}",
        "row passes: passes of a sample (simultaneous) or token step (sequential) actually computed; a "
        "sample is frozen once under the tolerance, and in sequential mode left out of its token's "
        "further steps, which also count each token's one commit step. Batch passes: calls of f, "
        "each a pass over the samples still running",
        f"sequential plain iteration computing every sample at every call instead: {every_row} row "
        f"passes, {ratio(every_row, plain.row_passes)} the {plain.row_passes} of leaving frozen samples out",
        "anderson and broyden are torchdeq's; safeguarded_anderson is implicitlm.deq.anderson "
        "(history 5, regularisation relative to each sample's residuals, restart when the residual "
        "rises). torchdeq's anderson regularises with an absolute 1e-4, which swamps residuals at "
        "this tolerance: its weights flatten to an average and it can be slower than plain iteration",
        f"medians of {repeats} runs after one warm-up; torch threads: {torch.get_num_threads()}",
    ]
    return table


def add_row(table: Table, mode: str, solver: str, stats, seconds: float, plain, plain_seconds: float) -> None:
    fewer = plain.row_passes / stats.row_passes
    table.add(
        mode, solver, stats.batch_passes, stats.row_passes, f"{stats.converged.float().mean().item():.0%}",
        f"{seconds:.3f}", ratio(stats.row_passes, plain.row_passes), ratio(seconds, plain_seconds),
        "baseline" if solver == BASELINE else verdict(fewer >= TARGET),
    )
