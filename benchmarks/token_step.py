"""Sequential decoding of a trained implicit model: time and stack steps per token.

    python benchmarks/token_step.py CHECKPOINT --data SHARDS [--solver NAME] [--tol T]

A hand loop of one-token sequential forwards (no ``generate()`` around it) after a 64-token
prompt from the held-out split of ``--data``, 32 tokens, medians of 5 runs: the token step
alone. To compare two versions of the library on the same machine, run it under each, e.g.
``git worktree add /tmp/before COMMIT`` and ``PYTHONPATH=/tmp/before/src python
benchmarks/token_step.py ...`` (PYTHONPATH comes before the installed package), alternating.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

import torch
from decoding import decode_tokens

import implicitlm
from implicitlm.data.shards import TokenShards
from implicitlm.models import load_model

PROMPT, TOKENS, REPEATS = 64, 32, 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data", type=Path, required=True, help="shard folder; its test split is read")
    parser.add_argument("--solver", default="fixed_point_iter")
    parser.add_argument("--tol", type=float, default=None, help="default: the model's evaluation tolerance")
    args = parser.parse_args()
    model = load_model(args.checkpoint).eval()
    options = {"solver": args.solver}
    if "sequential_solver" in model.solver.options.to_dict():  # absent before the solver per mode
        options["sequential_solver"] = ""
    model.set_fixed_point_options(**options)
    held_out = TokenShards(args.data, "test")
    prompt = torch.as_tensor(held_out.read(0, PROMPT).astype("int64"))[None]
    tokens = torch.as_tensor(held_out.read(PROMPT, TOKENS).astype("int64"))[None]
    steps = [0]
    step = model.stack.step

    @functools.wraps(step)
    def counted(*inputs, **options):
        steps[0] += 1
        return step(*inputs, **options)

    model.stack.step = counted

    @torch.no_grad()
    def decode() -> float:
        with model.track_convergence():
            state = model(prompt, use_cache=True).state
            steps[0] = 0
            start = time.perf_counter()
            decode_tokens(model, tokens, state, tol=args.tol)
            return (time.perf_counter() - start) / TOKENS * 1e3

    decode()
    times = [decode() for _ in range(REPEATS)]
    print(f"{implicitlm.__file__}: {statistics.median(times):.2f} ms/token, {steps[0] / TOKENS:.2f} stack steps "
          f"per token ({args.solver}, {torch.get_num_threads()} torch threads)")


if __name__ == "__main__":
    main()
