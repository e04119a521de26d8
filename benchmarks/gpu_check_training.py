"""The GPU check's training step, in a process of its own (gpu_check.py --step training)."""

from __future__ import annotations

import torch
from common import first_and_median_seconds
from gpu_check_shared import device, preset_model, report_figures
from training_step import peak_memory, training_step

TRAINING_VARIANTS = ("explicit", "bounded", "free")
# (batch, length, timed repeats): the 130M preset at the paper's context on a GPU; on a CPU
# the same presets (fixed-point budgets included) at a tiny width.
TRAINING_SIZES = {"gpu": (8, 1024, 3), "rehearsal": (2, 16, 1)}


def run(rehearse: bool, limit_s: float) -> None:
    """The 130M preset's training step (forward, loss, backward) under bf16 autocast, as
    the trainers run it on CUDA: explicit, bounded (4+1) and free (24+4): tokens/s, peak memory
    and the first step's time."""
    batch, length, repeats = TRAINING_SIZES["rehearsal" if rehearse else "gpu"]
    device_name, figures = device(rehearse), {}
    for variant in TRAINING_VARIANTS:
        model, ids = preset_model(variant, rehearse, batch, length)
        model.train()
        with torch.autocast(device_name, dtype=torch.bfloat16):
            # The first step compiles and tunes the kernels once per process, or once for all
            # of them where Triton's cache keeps the tuning.
            first, seconds = first_and_median_seconds(lambda: training_step(model, ids), repeats)
            figures[f"{variant} first step s"] = round(first, 2)
            figures[f"{variant} tokens/s"] = round(batch * length / seconds)
            if device_name == "cuda":
                figures[f"{variant} peak GiB"] = round(peak_memory(model, ids), 2)
            if variant != "explicit":
                with torch.no_grad():
                    figures[f"{variant} solver passes"] = int(model(ids).fixed_point.batch_passes)
        print(f"{variant}: {seconds:.3f} s per step of {batch} x {length} tokens", flush=True)
        report_figures(figures)
        del model
        if device_name == "cuda":
            torch.cuda.empty_cache()
