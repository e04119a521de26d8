"""The GPU check's scoring step, in a process of its own (gpu_check.py --step scoring)."""

from __future__ import annotations

import torch
from common import first_and_median_seconds, synchronize
from gpu_check_shared import INFERENCE_VARIANTS, device, preset_model, report_figures

# (batch, length, timed repeats): lm eval's windows of the paper's context, a batch of 8.
SCORING_SIZES = {"gpu": (8, 2048, 3), "rehearsal": (2, 16, 1)}


def run(rehearse: bool, limit_s: float) -> None:
    """One forward of 8 x 2,048 tokens (logits and all), without gradients, under bf16 autocast
    (the training step's kernel shapes, tuned already): the 130M implicit, its own budget and
    tolerance, against the explicit."""
    batch, length, repeats = SCORING_SIZES["rehearsal" if rehearse else "gpu"]
    device_name, figures = device(rehearse), {}
    for variant in INFERENCE_VARIANTS:
        model, ids = preset_model(variant, rehearse, batch, length)
        model.eval()
        scored = {}

        def score() -> None:
            scored["output"] = model(ids)
            synchronize(device_name)

        with torch.no_grad(), torch.autocast(device_name, dtype=torch.bfloat16):
            first, seconds = first_and_median_seconds(score, repeats)
        figures[f"{variant} first call s"] = round(first, 2)
        figures[f"{variant} tokens/s"] = round(batch * length / seconds)
        if model.config.implicit:
            figures[f"{variant} solver passes"] = int(scored["output"].fixed_point.batch_passes)
        print(f"{variant}: {seconds:.3f} s per forward of {batch} x {length} tokens", flush=True)
        report_figures(figures)
        del model, scored
    figures["implicit / explicit time"] = round(figures["explicit tokens/s"] / figures["bounded tokens/s"], 2)
    report_figures(figures)
