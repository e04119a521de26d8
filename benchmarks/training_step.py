"""Implicit (4+1) training step against an explicit one, compared with the FLOP ratio.

The bounded phase runs 4 passes without autograd and 1 phantom-gradient step
with it: 4 forward passes plus 1 forward + backward, about 4 + 3 = 7 forward-pass units
against the explicit model's 3, a FLOP ratio of 7/3. The solver's tolerance is set out of
reach so all 4 passes run. A step here is forward + loss + backward (the optimiser
update is the same for both and left out so it does not dilute the ratio); the
vocabulary is small so the backbone dominates, as it does in the paper's models.
"""

from __future__ import annotations

import time

import torch
from common import Table, paired_median_seconds, synchronize, verdict

from implicitlm.models import build_model, config_from_options
from implicitlm.train.speed import compile_stack

FLOP_RATIO = 7 / 3
TARGET = 1.15


def model_options(quick: bool, device: str) -> dict:
    if device == "cuda":  # the 130M model's backbone
        return dict(hidden_size=768, num_hidden_layers=24, state_size=128, head_dim=64)
    if quick:
        return dict(hidden_size=256, num_hidden_layers=4, state_size=64, head_dim=32)
    return dict(hidden_size=768, num_hidden_layers=4, state_size=128, head_dim=64)


def build(implicit: bool, options: dict, device: str):
    torch.manual_seed(0)
    fixed_point = dict(train_max_iter=4, phantom_steps=1, tau=0.8, train_tol=1e-12)
    config = config_from_options(
        dict(architecture="mamba2", vocab_size=256, expand=2, implicit=implicit, fixed_point=fixed_point, **options)
    )
    return build_model(config).to(device).train()


def training_step(model, input_ids: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(input_ids, labels=input_ids).loss.backward()
    synchronize(input_ids.device)


def peak_memory(model, input_ids: torch.Tensor) -> float:
    torch.cuda.reset_peak_memory_stats()
    training_step(model, input_ids)
    return torch.cuda.max_memory_allocated() / 2**30


def run(quick: bool, device: str = "cpu") -> Table:
    options = model_options(quick, device)
    batch, length = (8, 1024) if device == "cuda" else ((2, 256) if quick else (1, 512))
    repeats = 3 if quick else 11
    input_ids = torch.randint(0, 256, (batch, length), device=device)
    columns = ["model", "step s", "ratio to explicit", "FLOP ratio", "measured / FLOP ratio"]
    if device == "cuda":
        columns.append("peak memory GiB")
    table = Table(f"Training step (forward + backward), Mamba2 {options}, batch {batch} x {length}, {device}", columns)
    explicit, implicit = build(False, options, device), build(True, options, device)
    timed = paired_median_seconds(
        lambda: training_step(explicit, input_ids), lambda: training_step(implicit, input_ids), repeats
    )
    explicit_s, implicit_s, measured = timed.baseline, timed.candidate, timed.ratio
    explicit_row = ["explicit", f"{explicit_s:.3f}", "1.00x", "1", "-"]
    implicit_row = ["implicit (4+1)", f"{implicit_s:.3f}", f"{measured:.2f}x", f"{FLOP_RATIO:.2f}", f"{measured / FLOP_RATIO:.2f}"]
    if device == "cuda":
        explicit_row.append(f"{peak_memory(explicit, input_ids):.2f}")
        implicit_row.append(f"{peak_memory(implicit, input_ids):.2f}")
    table.add(*explicit_row)
    table.add(*implicit_row)
    table.notes.append(
        f"target measured <= {TARGET} x FLOP ratio: {verdict(measured / FLOP_RATIO <= TARGET)}; "
        f"medians of {repeats} runs, the two models timed in alternation (ratio: median of the per-pair ratios)"
    )
    if not quick:
        add_compiled_row(table, implicit, explicit_s, options, input_ids, repeats)
    return table


def add_compiled_row(table: Table, eager, explicit_s: float, options: dict, input_ids: torch.Tensor, repeats: int) -> None:
    """The implicit model with its stack compiled (the trainers' ``compile`` option), timed in
    alternation with the eager one; the compile itself is timed on its own."""
    compiled = build(True, options, input_ids.device.type)
    compile_stack(compiled)
    start = time.perf_counter()
    training_step(compiled, input_ids)
    compile_s = time.perf_counter() - start
    timed = paired_median_seconds(
        lambda: training_step(eager, input_ids), lambda: training_step(compiled, input_ids), repeats
    )
    compiled_s, speedup = timed.candidate, 1 / timed.ratio
    measured = compiled_s / explicit_s
    table.add("implicit (4+1), compiled stack", f"{compiled_s:.3f}", f"{measured:.2f}x", f"{FLOP_RATIO:.2f}", f"{measured / FLOP_RATIO:.2f}")
    table.notes.append(
        f"compiled stack (against the eager explicit model): first step {compile_s:.0f} s of compilation, "
        f"then {speedup:.2f}x the speed of the eager implicit model"
    )
