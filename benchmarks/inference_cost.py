"""A trained implicit model's inference cost against its explicit twin, per solver and tolerance.

    python benchmarks/inference_cost.py --implicit CKPT --explicit CKPT --data SHARDS
        [--tols 0.05,0.01] [--solvers fixed_point_iter,safeguarded_anderson,learned_anderson]
        [--starts zero,learned] [--guesses-from CKPT,...] [--passes 1,2,3]
        [--windows 32] [--quick] [--out FILE]

A study of a trained pair (the README's WikiText-2 runs), not a section of ``run.py``: the
number of passes per solve, which sets the cost, is a property of trained weights. On the
held-out split of ``--data``:

- decoding: ``generate()`` after a 64-token prompt, greedy, per-token time
  ((N + 1 tokens) - (1 token)) / N, and the passes of the stack per token;
- scoring: one batch of ``--windows`` x 256-token windows in simultaneous mode (one solve per
  window, as ``lm eval`` and lm-eval's loglikelihood run them): time, held-out perplexity, and
  its difference to a solve to 1e-4 (the fixed point itself, to the scores' digits).

``--starts``: where each solve starts, z = 0 and (for a checkpoint that has one, from
``implicitlm solver train``) the learned initial guess; ``--guesses-from``: other fits' guesses
for the same weights (a guess that reads the state beside one that does not), each one more
start; ``learned_anderson`` among the
solvers: safeguarded Anderson with the checkpoint's learned mixing, where it has one. Every implicit row is a ratio to the
explicit model measured in the same run. ``--passes``: a row per K and start beside the tolerance rows (``--tols ""``:
those rows only), every solve exactly K plain passes (``FixedPointOptions.passes``), each of its runs timed in
alternation with the explicit model's, so that a busy machine's drift falls on both (decoding: the ratio of the
per-token medians; scoring: the median of the per-pair ratios). The last row, always: the implicit model as
shipped, its checkpoint's own options (passes, solver, guess, tolerance), timed the same way.
"""

from __future__ import annotations

import argparse
import functools
import math
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from common import Table, median_seconds, paired_median_seconds, ratio

from implicitlm.core.weights_digest import weights_sha256
from implicitlm.data.shards import TokenShards
from implicitlm.deq.options import every_solve_by
from implicitlm.models import load_model

PROMPT, WINDOW = 64, 256
TIGHT_TOL = 1e-4


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


# Every run below takes the fixed-point options it runs with as an argument (None: the model's
# own, as shipped): a row's settings are that row's, never left on the model for the next.


def generating(model, prompt: torch.Tensor, count: int, fixed_point: dict | None = None) -> Callable[[], None]:
    """A run of greedy ``generate()`` of ``count`` tokens after ``prompt``."""
    @torch.no_grad()
    def run() -> None:
        with model.track_convergence():
            model.generate(prompt, max_new_tokens=count, min_new_tokens=count, do_sample=False, fixed_point=fixed_point)
    return run


def decode(model, prompt: torch.Tensor, tokens: int, repeats: int, fixed_point: dict | None = None) -> tuple[float, float]:
    """(ms per token, stack passes per token) of greedy ``generate()`` after ``prompt``."""
    one = median_seconds(generating(model, prompt, 1, fixed_point), repeats)
    many = median_seconds(generating(model, prompt, tokens + 1, fixed_point), repeats)
    return (many - one) / tokens * 1e3, passes_per_token(model, prompt, tokens, fixed_point)


def passes_per_token(model, prompt: torch.Tensor, tokens: int, fixed_point: dict | None = None) -> float:
    """The stack passes of each token that greedy ``generate()`` decodes after ``prompt``."""
    counter = getattr(model, "_counter", None) or EvaluationCounter(model)
    model._counter = counter
    counter.count = 0
    generating(model, prompt, 1, fixed_point)()
    first = counter.count
    counter.count = 0
    generating(model, prompt, tokens + 1, fixed_point)()
    return (counter.count - first) / tokens


def scoring(model, windows: torch.Tensor, results: dict, fixed_point: dict | None = None) -> Callable[[], None]:
    """A run of one simultaneous pass over ``windows``, leaving its held-out loss and its share of
    windows short of the tolerance in ``results`` (a K-pass answer's last step held to it too, read
    off the stats: a tally counts no misses of a fixed budget, which holds no tolerance)."""
    @torch.no_grad()
    def run() -> None:
        output = model(windows[:, :-1], fixed_point=fixed_point)
        results["loss"] = F.cross_entropy(output.logits.flatten(0, 1).float(), windows[:, 1:].flatten()).item()
        results["missed"] = float((~output.fixed_point.converged).float().mean()) if output.fixed_point else 0.0
    return run


def score(model, windows: torch.Tensor, repeats: int, fixed_point: dict | None = None) -> tuple[float, float, float]:
    """(seconds, held-out loss, share of windows short of the tolerance) of one simultaneous pass."""
    results: dict = {}
    seconds = median_seconds(scoring(model, windows, results, fixed_point), repeats)
    return seconds, results["loss"], results["missed"]


def paired_decode(explicit, implicit, prompt: torch.Tensor, tokens: int, repeats: int,
                  fixed_point: dict | None = None) -> tuple[float, float]:
    """(explicit, implicit) ms per decoded token, each ``generate()`` timed in alternation with the other's."""
    one = paired_median_seconds(generating(explicit, prompt, 1), generating(implicit, prompt, 1, fixed_point), repeats)
    many = paired_median_seconds(generating(explicit, prompt, tokens + 1),
                                 generating(implicit, prompt, tokens + 1, fixed_point), repeats)
    return (many.baseline - one.baseline) / tokens * 1e3, (many.candidate - one.candidate) / tokens * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--implicit", type=Path, required=True)
    parser.add_argument("--explicit", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="shard folder; its test split is read")
    parser.add_argument("--tols", default="0.05,0.01")
    parser.add_argument("--solvers", default="fixed_point_iter,safeguarded_anderson,learned_anderson",
                        help="learned_anderson where the checkpoint has a learned mixing")
    parser.add_argument("--starts", default="zero,learned", help="zero, and learned where the checkpoint has a guess")
    parser.add_argument("--guesses-from", default="",
                        help="checkpoints of the same weights whose learned guesses are further starts")
    parser.add_argument("--passes", default="", help="comma-separated K: a row per K and start, exactly K passes a solve")
    parser.add_argument("--windows", type=int, default=32, help="256-token windows scored in one batch")
    parser.add_argument("--tokens", type=int, default=32, help="decoded tokens timed")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (their median)")
    parser.add_argument("--quick", action="store_true", help="8 tokens, one run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tokens, repeats = (8, 1) if args.quick else (args.tokens, args.repeats)
    held_out = TokenShards(args.data, "test")
    prompt = torch.as_tensor(held_out.read(0, PROMPT).astype("int64"))[None]
    count = args.windows
    windows = torch.as_tensor(held_out.read(PROMPT, count * (WINDOW + 1)).astype("int64")).view(count, WINDOW + 1)
    explicit, implicit = load_model(args.explicit).eval(), load_model(args.implicit).eval()
    starts = {start: implicit.learned_guess for start in args.starts.split(",")
              if start == "zero" or implicit.learned_guess is not None}
    starts.update(other_guesses(args.implicit, args.guesses_from))
    solvers = [solver for solver in args.solvers.split(",")
               if solver != "learned_anderson" or implicit.learned_mixing is not None]
    base_decode = decode(explicit, prompt, tokens, repeats)
    base_score = score(explicit, windows, repeats)
    # The checkpoint's own options and guess, for the row of the model run as shipped (no flags).
    shipped, shipped_guess = implicit.solver.options, implicit.learned_guess
    tight = dict(tol=TIGHT_TOL, max_iter=400, passes=0, initial_guess="zero", simultaneous_initial_guess="")
    tight_loss = score(implicit, windows, 1, tight)[1]
    table = Table(
        f"Trained pair {args.implicit} vs {args.explicit}: decoding after {PROMPT} tokens and scoring "
        f"{count} x {WINDOW} held-out tokens, {torch.get_num_threads()} torch threads",
        ["model", "solver", "start", "tol", "decode ms/token", "decode / explicit", "stack passes per token",
         "score s", "score / explicit", "perplexity", "vs tol 1e-4", "windows not converged"],
    )
    table.add("explicit", "-", "-", "-", f"{base_decode[0]:.2f}", "1.00x", f"{base_decode[1]:.1f}",
              f"{base_score[0]:.2f}", "1.00x", f"{math.exp(base_score[1]):.2f}", "-", "-")
    for solver in solvers:
        for start, guess in starts.items():
            for tol in (float(t) for t in args.tols.split(",") if t):
                implicit.attach_learned_guess(guess, use=None)
                # A solve to the tolerance, whatever passes the checkpoint declares.
                row = {**every_solve_by(solver), **started(start), "tol": tol, "max_iter": 64, "passes": 0}
                ms, passes = decode(implicit, prompt, tokens, repeats, row)
                seconds, loss, missed = score(implicit, windows, repeats, row)
                table.add("implicit", solver, start, f"{tol:g}", f"{ms:.2f}", ratio(ms, base_decode[0]),
                          f"{passes:.2f}", f"{seconds:.2f}", ratio(seconds, base_score[0]),
                          *quality_cells(loss, missed, tight_loss))
    for passes in (int(k) for k in args.passes.split(",") if k):
        for start, guess in starts.items():
            implicit.attach_learned_guess(guess, use=None)
            # A K-pass answer's last step is held to the checkpoint's own tolerance in "not converged".
            row = {**started(start), "passes": passes, "tol": shipped.tol}
            table.add("implicit", f"{passes} passes", start, "-",
                      *paired_cells(explicit, implicit, prompt, windows, tokens, repeats, tight_loss, row))
    implicit.attach_learned_guess(shipped_guess, use=None)
    table.add("implicit, as shipped", shipped.described_solver("simultaneous"), "its own",
              "-" if shipped.passes else f"{shipped.tol:g}",
              *paired_cells(explicit, implicit, prompt, windows, tokens, repeats, tight_loss))
    table.notes.append(f"medians of {repeats} runs; decoding over {tokens} tokens; a token's stack passes are its "
                       "solver's calls of the stack (its state comes from the last of them)")
    table.publish(args.out)


def paired_cells(explicit, implicit, prompt: torch.Tensor, windows: torch.Tensor, tokens: int, repeats: int,
                 tight_loss: float, fixed_point: dict | None = None) -> list[str]:
    """A row's cells from decode ms/token on, the implicit model run with ``fixed_point`` (None:
    its own options), each of its runs timed in alternation with the explicit model's (decoding:
    the ratio of the per-token medians; scoring: the median of the per-pair ratios)."""
    base_ms, ms = paired_decode(explicit, implicit, prompt, tokens, repeats, fixed_point)
    per_token = passes_per_token(implicit, prompt, tokens, fixed_point)
    results: dict = {}
    scored = paired_median_seconds(scoring(explicit, windows, {}), scoring(implicit, windows, results, fixed_point),
                                   repeats)
    loss, missed = results["loss"], results["missed"]
    return [f"{ms:.2f}", ratio(ms, base_ms), f"{per_token:.2f}", f"{scored.candidate:.2f}", f"{scored.ratio:.2f}x",
            *quality_cells(loss, missed, tight_loss)]


def started(start: str) -> dict[str, str]:
    """The options of a row's start: z = 0, or the learned guess attached, in both modes."""
    return {"initial_guess": "zero" if start == "zero" else "learned", "simultaneous_initial_guess": "",
            "sequential_initial_guess": ""}


def quality_cells(loss: float, missed: float, tight_loss: float) -> list[str]:
    """Perplexity, its distance to the tight fixed point's, and the share of windows not converged."""
    return [f"{math.exp(loss):.2f}", f"{math.exp(loss - tight_loss) - 1:+.2%}", f"{missed:.1%}"]


def other_guesses(implicit: Path, folders: str) -> dict:
    """start label -> learned guess of each checkpoint in ``folders`` (comma-separated), which
    must hold ``implicit``'s weights."""
    guesses = {}
    for folder in (Path(name) for name in folders.split(",") if name):
        if weights_sha256(folder) != weights_sha256(implicit):
            raise SystemExit(f"{folder}: other weights than {implicit}; --guesses-from takes fits of the same model")
        guess = load_model(folder).learned_guess
        if guess is None:
            raise SystemExit(f"{folder}: no learned guess")
        guesses[f"learned ({'reads the state' if guess.reads_state else folder.name})"] = guess
    return guesses


if __name__ == "__main__":
    main()
