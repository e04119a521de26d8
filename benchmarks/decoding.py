"""Sequential (RNN) decoding: per-token latency deep into a sequence against near its start.

A prompt of P tokens is prefilled in parallel (its state is all that matters here, so
the prefill runs a short solve), then tokens are decoded one by one in sequential mode,
each with a fixed number of passes (tolerance out of reach), so every token
does the same work wherever it sits. A Mamba2 state has a fixed size, so its latency
should not grow with the position; a Llama KV cache grows, shown for comparison.
"""

from __future__ import annotations

import torch
from common import Table, median_seconds, synchronize, verdict

from implicitlm.models import build_model, config_from_options

NEAR, FAR = 64, 4096
ITERATIONS = 8
TARGET = 1.2
MODELS = {
    "implicit Mamba2": dict(architecture="mamba2", implicit=True, state_size=64, head_dim=32),
    "explicit Mamba2": dict(architecture="mamba2", implicit=False, state_size=64, head_dim=32),
    "implicit Llama": dict(architecture="llama", implicit=True, num_attention_heads=4),
}


def build(options: dict, device: str):
    torch.manual_seed(0)
    config = config_from_options(dict(vocab_size=256, hidden_size=256, num_hidden_layers=4, **options))
    return build_model(config).to(device).eval()


@torch.no_grad()
def decode_latency(model, position: int, tokens: int, repeats: int, device: str) -> float:
    """Median seconds per token for ``tokens`` tokens decoded after a prompt of ``position``."""
    prompt = torch.randint(0, 256, (1, position), device=device)
    prefilled = model(prompt, use_cache=True, max_iter=2).state
    new_tokens = torch.randint(0, 256, (1, tokens), device=device)

    def decode() -> None:
        decode_tokens(model, new_tokens, prefilled, max_iter=ITERATIONS, tol=1e-12)
        synchronize(device)

    return median_seconds(decode, repeats) / tokens


def decode_tokens(model, tokens: torch.Tensor, state, **budget):
    """The state after ``tokens`` (batch x n), read from ``state`` one forward a token in
    sequential mode, each with ``budget`` (its fixed-point options): decoding's token step
    alone, without ``generate()``'s choice of the next token around it."""
    for t in range(tokens.shape[1]):
        state = model(tokens[:, t : t + 1], state=state, mode="sequential", **budget).state
    return state


def run(quick: bool, device: str = "cpu") -> Table:
    tokens, repeats = (16, 5) if quick else (32, 9)
    table = Table(
        f"Sequential decoding, {ITERATIONS} passes per token, d_model 256, 4 layers, {device}",
        ["model", f"ms/token at {NEAR}", f"ms/token at {FAR}", f"{FAR} / {NEAR}"],
    )
    ratios = {}
    for name, options in MODELS.items():
        model = build(options, device)
        near = decode_latency(model, NEAR, tokens, repeats, device)
        far = decode_latency(model, FAR, tokens, repeats, device)
        ratios[name] = far / near
        table.add(name, f"{near * 1e3:.2f}", f"{far * 1e3:.2f}", f"{far / near:.2f}x")
    mamba = max(ratios["implicit Mamba2"], ratios["explicit Mamba2"])
    table.notes.append(f"target Mamba2 {FAR}/{NEAR} <= {TARGET}: {verdict(mamba <= TARGET)}; medians of {repeats} runs")
    return table
