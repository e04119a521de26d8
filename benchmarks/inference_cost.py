"""A trained implicit model's inference cost against its explicit twin, per solver and tolerance.

    python benchmarks/inference_cost.py --implicit CKPT --explicit CKPT --data SHARDS
        [--tols 0.05,0.01] [--solvers fixed_point_iter,safeguarded_anderson] [--quick] [--out FILE]

A study of a trained pair (the README's WikiText-2 runs), not a section of ``run.py``: the
number of solver iterations, which sets the cost, is a property of trained weights. On the
held-out split of ``--data``:

- decoding: ``generate()`` after a 64-token prompt, greedy, per-token time
  ((N + 1 tokens) - (1 token)) / N, and the stack evaluations per token;
- scoring: one batch of 8 x 256-token windows in simultaneous mode (one solve per window,
  as ``lm eval`` and lm-eval's loglikelihood run them): time and held-out loss.

Every implicit row is a ratio to the explicit model measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from common import Table, median_seconds

from implicitlm.data.shards import TokenShards
from implicitlm.models import load_model

PROMPT, WINDOW, WINDOWS = 64, 256, 8


class EvaluationCounter:
    """Counts the stack's passes (a token step or a whole-sequence pass), whatever calls them."""

    def __init__(self, model) -> None:
        self.count = 0
        stack = model.stack
        for name in ("step", "forward"):
            method = getattr(stack, name)

            @functools.wraps(method)
            def counted(*args, _method=method, **kwargs):
                self.count += 1
                return _method(*args, **kwargs)

            setattr(stack, name, counted)


@torch.no_grad()
def decode(model, prompt: torch.Tensor, tokens: int, repeats: int) -> tuple[float, float]:
    """(ms per token, stack passes per token) of greedy ``generate()`` after ``prompt``."""
    counter = getattr(model, "_counter", None) or EvaluationCounter(model)
    model._counter = counter

    def generate(count: int):
        def run() -> None:
            with model.track_convergence():
                model.generate(prompt, max_new_tokens=count, min_new_tokens=count, do_sample=False)
        return run

    one, many = median_seconds(generate(1), repeats), median_seconds(generate(tokens + 1), repeats)
    counter.count = 0
    generate(1)()
    first = counter.count
    counter.count = 0
    generate(tokens + 1)()
    return (many - one) / tokens * 1e3, (counter.count - first) / tokens


@torch.no_grad()
def score(model, windows: torch.Tensor, repeats: int) -> tuple[float, float, float]:
    """(seconds, held-out loss, share of windows short of the tolerance) of one simultaneous pass."""
    results = {}

    def run() -> None:
        with model.track_convergence() as tally:
            logits = model(windows[:, :-1]).logits
        results["loss"] = F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten()).item()
        results["missed"] = tally.not_converged_share

    seconds = median_seconds(run, repeats)
    return seconds, results["loss"], results["missed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--implicit", type=Path, required=True)
    parser.add_argument("--explicit", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="shard folder; its test split is read")
    parser.add_argument("--tols", default="0.05,0.01")
    parser.add_argument("--solvers", default="fixed_point_iter,safeguarded_anderson")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tokens, repeats = (8, 1) if args.quick else (32, 3)
    held_out = TokenShards(args.data, "test")
    prompt = torch.as_tensor(held_out.read(0, PROMPT).astype("int64"))[None]
    windows = torch.as_tensor(held_out.read(PROMPT, WINDOWS * (WINDOW + 1)).astype("int64")).view(WINDOWS, WINDOW + 1)
    explicit, implicit = load_model(args.explicit).eval(), load_model(args.implicit).eval()
    base_decode = decode(explicit, prompt, tokens, repeats)
    base_score = score(explicit, windows, repeats)
    table = Table(
        f"Trained pair {args.implicit} vs {args.explicit}: decoding after {PROMPT} tokens and scoring "
        f"{WINDOWS} x {WINDOW} held-out tokens, {torch.get_num_threads()} torch threads",
        ["model", "solver", "tol", "decode ms/token", "decode / explicit", "stack passes per token",
         "score s", "score / explicit", "held-out loss", "windows not converged"],
    )
    table.add("explicit", "-", "-", f"{base_decode[0]:.2f}", "1.00x", f"{base_decode[1]:.1f}",
              f"{base_score[0]:.2f}", "1.00x", f"{base_score[1]:.4f}", "-")
    for solver in args.solvers.split(","):
        for tol in (float(t) for t in args.tols.split(",")):
            implicit.use_solver(solver)
            implicit.set_fixed_point_options(tol=tol)
            ms, passes = decode(implicit, prompt, tokens, repeats)
            seconds, loss, missed = score(implicit, windows, repeats)
            table.add("implicit", solver, f"{tol:g}", f"{ms:.2f}", f"{ms / base_decode[0]:.2f}x", f"{passes:.1f}",
                      f"{seconds:.2f}", f"{seconds / base_score[0]:.2f}x", f"{loss:.4f}", f"{missed:.1%}")
    table.notes.append(f"medians of {repeats} runs; decoding over {tokens} tokens; a token's stack passes are its "
                       "solver's evaluations (its state comes from the last of them)")
    table.publish(args.out)


if __name__ == "__main__":
    main()
