"""The GPU check's decoding step, in a process of its own (gpu_check.py --step decoding)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from common import synchronize
from decoding import decode_tokens
from gpu_check_shared import INFERENCE_VARIANTS, preset_model, report_figures

# The 130M at batch 1: (prompt tokens, decoded tokens, repeats). The prompt is read token by
# token too (sequential), so no step here tunes the fused kernel.
DECODING_130M = {"gpu": (16, 32, 5), "rehearsal": (4, 2, 1)}
DECODING_PASSES = (8, 2)


def token_seconds(model, ids, prompt_tokens: int, passes: int, graphed: bool, repeats: int) -> tuple[float, float]:
    """(the first call's seconds, the median's per token) of decoding ``ids`` after a prompt of
    ``prompt_tokens`` (read token by token), ``passes`` a token; ``graphed``: inside
    ``decoding_graphs``, whose first call captures the graphs."""
    budget = {"passes": passes} if model.config.implicit else {}
    tokens = ids.shape[1] - prompt_tokens

    @torch.no_grad()
    def decode() -> float:
        # Prefilled afresh for every run: inside decoding_graphs a returned state is the graph's
        # buffers, which the next run's tokens overwrite.
        state = model(ids[:, :prompt_tokens], use_cache=True, mode="sequential", **budget).state
        synchronize(str(ids.device))
        started = time.perf_counter()
        decode_tokens(model, ids[:, prompt_tokens:], state, **budget)
        synchronize(str(ids.device))
        return time.perf_counter() - started

    with model.decoding_graphs() if graphed else contextlib.nullcontext():
        first = decode()  # allocations, kernels compiled where any, and graphs captured
        return first, sorted(decode() for _ in range(repeats))[repeats // 2] / tokens


def run(rehearse: bool, limit_s: float) -> None:
    """ms/token at batch 1: the 130M explicit and implicit (K passes a token, K = 8 as
    benchmarks/decoding.py's budget and the shipped K = 2), eager and from captured CUDA graphs
    (``decoding_graphs``). benchmarks/decoding.py's small models at positions near and far are
    left to benchmarks/run.py: their prefill of 4,096 tokens tunes the fused kernel at shapes of
    their own, a minute of the step's limit (the H200 run of 2026-11-27)."""
    prompt_tokens, tokens, repeats = DECODING_130M["rehearsal" if rehearse else "gpu"]
    figures: dict[str, Any] = {}
    for variant in INFERENCE_VARIANTS:
        model, ids = preset_model(variant, rehearse, 1, prompt_tokens + tokens)
        model.eval()
        for passes in DECODING_PASSES if model.config.implicit else (1,):
            for graphed in (False, True):
                name = f"130M {variant}{f' {passes} passes' if model.config.implicit else ''}{' graphed' * graphed}"
                first, seconds = token_seconds(model, ids, prompt_tokens, passes, graphed, repeats)
                figures[f"{name} ms/token"] = round(seconds * 1e3, 3)
                if graphed:
                    figures[f"{name} first call s"] = round(first, 2)
                print(f"{name}: {figures[f'{name} ms/token']} ms/token", flush=True)
                report_figures(figures)
        del model
    for passes in DECODING_PASSES:
        for graphed in ("", " graphed"):
            # An implicit token against as many explicit ones as it has passes.
            implicit = figures[f"130M bounded {passes} passes{graphed} ms/token"]
            figures[f"130M implicit / ({passes} x explicit){graphed}"] = round(
                implicit / (passes * figures[f"130M explicit{graphed} ms/token"]), 2)
    report_figures(figures)
