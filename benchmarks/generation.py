"""generate(): per-token decoding cost after a short and a long prompt.

transformers' ``generate`` drives the model; if it stops carrying the recurrent state from
one forward to the next, every new token re-reads the whole sequence and the cost per token
grows with the prompt (a generation becomes quadratic in its length). Per-token cost is the
time of generating N + 1 tokens less that of generating 1 (the prefill and the first token),
over N. Baseline in the same run: the same tokens decoded by a hand-written loop of
sequential forwards from the prefilled state, which is what ``generate`` should reduce to.
Every solve runs a fixed number of passes (tolerance out of reach), so each token does
the same work wherever it sits.
"""

from __future__ import annotations

import torch
from common import Table, median_seconds, synchronize, verdict
from decoding import ITERATIONS, MODELS, build

SHORT, LONG = 64, 256
TARGET = 1.2  # per-token cost after the long prompt / after the short one
BUDGET = dict(max_iter=ITERATIONS, tol=1e-12)


@torch.no_grad()
def generate_ms_per_token(model, prompt: torch.Tensor, tokens: int, repeats: int, device: str) -> float:
    def generate(new_tokens: int):
        def run() -> None:
            # Tracked here so that generate() leaves the unreachable tolerance unreported.
            with model.track_convergence():
                model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **BUDGET)
            synchronize(device)

        return run

    return (median_seconds(generate(tokens + 1), repeats) - median_seconds(generate(1), repeats)) / tokens * 1e3


@torch.no_grad()
def loop_ms_per_token(model, prompt: torch.Tensor, tokens: int, repeats: int, device: str) -> float:
    prefilled = model(prompt, use_cache=True, logits_to_keep=1, **BUDGET).state
    new_tokens = torch.randint(0, 256, (prompt.shape[0], tokens), device=device)

    def decode() -> None:
        state = prefilled
        for t in range(tokens):
            state = model(new_tokens[:, t : t + 1], state=state, mode="sequential", **BUDGET).state
        synchronize(device)

    return median_seconds(decode, repeats) / tokens * 1e3


def run(quick: bool, device: str = "cpu") -> Table:
    tokens, repeats = (8, 3) if quick else (24, 5)
    table = Table(
        f"generate(), greedy, batch 1, {ITERATIONS} passes per token, d_model 256, 4 layers, {device}",
        ["model", f"ms/token after {SHORT}", f"ms/token after {LONG}", f"{LONG} / {SHORT}",
         f"generate / hand loop at {SHORT}", f"generate / hand loop at {LONG}"],
    )
    growth = {}
    for name in ("implicit Mamba2", "explicit Mamba2"):
        model = build(MODELS[name], device)
        row = {}
        for length in (SHORT, LONG):
            # Drawn on the CPU, whose generator any device's run can seed alike, then moved.
            prompt = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length)).to(device)
            row[length] = (
                generate_ms_per_token(model, prompt, tokens, repeats, device),
                loop_ms_per_token(model, prompt, tokens, repeats, device),
            )
        growth[name] = row[LONG][0] / row[SHORT][0]
        table.add(
            name, f"{row[SHORT][0]:.2f}", f"{row[LONG][0]:.2f}", f"{growth[name]:.2f}x",
            f"{row[SHORT][0] / row[SHORT][1]:.2f}x", f"{row[LONG][0] / row[LONG][1]:.2f}x",
        )
    worst = max(growth.values())
    table.notes.append(
        f"target {LONG}/{SHORT} <= {TARGET} (flat in the prompt length: the state is carried, the prompt is not "
        f"re-solved): {verdict(worst <= TARGET)}; medians of {repeats} runs, {tokens} tokens each"
    )
    return table
