"""Half precision on a CPU: bfloat16 and float16 against float32, in scoring and in decoding.

    python benchmarks/precision.py [--quick] [--device cpu]

The shipped WikiText-2 pair (``checkpoints/wikitext2/warm_start``: 1-layer Mamba2, d_model
296) loaded in each dtype, on the first tokens of WikiText-2's validation text:

- scoring: one simultaneous forward over 8 x 256 tokens with the model's own evaluation
  settings (chunks of 256, safeguarded Anderson, tolerance 0.01 raised to the dtype's floor):
  time, the largest logit difference from float32, perplexity, passes per solve;
- decoding: greedy ``generate()`` of 32 tokens after a 64-token prompt: time per token
  ((1 + 32 tokens) - (1 token), which leaves the prompt's prefill out), the tokens float32
  also chose, and the largest logit difference of a sequential forward over float32's
  sequence (the same inputs in every dtype, so a token chosen differently does not count).

Every half-precision row is a ratio against float32 measured in the same run, timed in
alternation with it (another process's burst of load then falls on both).

``floors()``: the relative residual a solve reaches in each dtype when no tolerance stops it
(``solver.RESIDUAL_FLOOR_EPSILONS`` set to 0 here), in units of the dtype's epsilon: what the
floor that ``solver.residual_floor`` puts under every tolerance rests on.
"""

from __future__ import annotations

import argparse
import contextlib
import lzma
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
import transformers
from common import Table, paired_median_seconds

from implicitlm.data.tokenizer import load_tokenizer
from implicitlm.deq import residuals
from implicitlm.deq.options import every_solve_by
from implicitlm.models import load_model

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "checkpoints" / "wikitext2" / "warm_start"
VALID = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.txt.xz"
DTYPES = ("float32", "bfloat16", "float16")
PROMPT, NEW_TOKENS, WINDOW, WINDOWS = 64, 32, 256, 8
# About 3.4 characters a token with this tokenizer: 20,000 give the 2,120 needed with room to spare.
CHARACTERS = 20_000
FLOOR_SOLVERS = ("fixed_point_iter", "safeguarded_anderson")
FLOOR_BUDGET = 200


def missing() -> str | None:
    """Why this benchmark cannot run here (its data or checkpoints absent), or None."""
    for path in (VALID, CHECKPOINTS / "implicit", CHECKPOINTS / "explicit"):
        if not path.exists():
            return f"skipped: {path} not found"
    return None


def held_out(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(a 1 x 64 prompt, 8 windows of 257 tokens after it) from the validation text's start."""
    with lzma.open(VALID, "rt", encoding="utf-8") as file:
        text = file.read(CHARACTERS)
    ids = torch.tensor(load_tokenizer(CHECKPOINTS / "implicit")(text)["input_ids"], device=device)
    needed = PROMPT + WINDOWS * (WINDOW + 1)
    if len(ids) < needed:
        raise RuntimeError(f"{VALID}: {CHARACTERS} characters gave {len(ids)} tokens, fewer than {needed}")
    return ids[None, :PROMPT], ids[PROMPT:needed].view(WINDOWS, WINDOW + 1)


def load(kind: str, dtype: str, device: str):
    return load_model(CHECKPOINTS / kind, dtype=dtype).to(device).eval()


@contextlib.contextmanager
def solves(model):
    """The FixedPointStats of every forward inside the block (None for an explicit model)."""
    seen: list = []
    handle = model.register_forward_hook(lambda module, args, output: seen.append(output.fixed_point))
    try:
        yield seen
    finally:
        handle.remove()


def largest_difference(logits: torch.Tensor, reference: torch.Tensor) -> str:
    gap = (logits.float() - reference).abs().max().item()
    if gap == 0:
        return "0"
    return f"{gap:.3g} ({gap / reference.abs().max().item():.1e})"


@torch.no_grad()
def score(model, windows: torch.Tensor) -> dict:
    """One simultaneous forward: its logits (float32), perplexity and fixed-point figures."""
    output = model(windows[:, :-1])
    logits = output.logits.float()
    loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
    result = {"logits": logits, "ppl": loss.exp().item()}
    stats = output.fixed_point
    if stats is not None:
        result.update(passes=stats.passes.float().mean().item(), batch_passes=stats.batch_passes,
                      tol=stats.tol, missed=(~stats.converged).float().mean().item())
    return result


@torch.no_grad()
def generate(model, prompt: torch.Tensor, tokens: int) -> torch.Tensor:
    return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)


@torch.no_grad()
def decode(model, prompt: torch.Tensor) -> dict:
    """Greedy tokens after ``prompt``, with passes per decoded token and the share of the
    generation's fixed points (the prefill's and each token's) that stopped above the tolerance."""
    with solves(model) as seen:
        sequence = generate(model, prompt, NEW_TOKENS)
    result = {"sequence": sequence}
    if model.config.implicit:
        steps = seen[1:]  # the first forward is the prompt's prefill
        result.update(passes=sum(s.passes.float().mean().item() for s in steps) / len(steps),
                      missed=model.generation_convergence["fp_not_converged_share"])
    return result


def decode_seconds(model, prompt: torch.Tensor):
    """A run whose time is the prefill, one token and ``NEW_TOKENS`` more; the same less one
    token's is the prefill alone, and their difference the decoding."""
    return lambda: generate(model, prompt, NEW_TOKENS + 1), lambda: generate(model, prompt, 1)


def timings(models: dict, prompt: torch.Tensor, windows: torch.Tensor, repeats: int) -> dict:
    """Per dtype: (scoring seconds, its ratio to float32, decoding seconds per token, its ratio).
    Decoding gets twice the repeats: its time per token is a difference of two runs of a
    tenth of a second or so, noisier than either."""
    base = models["float32"]
    base_decode, base_prefill = decode_seconds(base, prompt)
    result = {}
    for dtype, model in models.items():
        scoring = paired_median_seconds(lambda: score(base, windows), lambda: score(model, windows), repeats)
        full, prefill = decode_seconds(model, prompt)
        decoding = paired_median_seconds(base_decode, full, 2 * repeats)
        prefilled = paired_median_seconds(base_prefill, prefill, 2 * repeats)
        per_token = (decoding.candidate - prefilled.candidate) / NEW_TOKENS
        base_per_token = (decoding.baseline - prefilled.baseline) / NEW_TOKENS
        result[dtype] = (scoring.candidate, scoring.ratio, per_token, per_token / base_per_token)
    return result


def figures(model, prompt: torch.Tensor, windows: torch.Tensor) -> dict:
    return {"score": score(model, windows), "decode": decode(model, prompt)}


def row(kind: str, dtype: str, measured: dict, base: dict, times: tuple, sequential: torch.Tensor,
        base_sequential: torch.Tensor) -> list:
    scored, decoded = measured["score"], measured["decode"]
    generated = decoded["sequence"][0, PROMPT:]
    equal = int((generated == base["decode"]["sequence"][0, PROMPT:]).sum())
    implicit = "passes" in scored
    return [
        kind, dtype, f"{times[0] * 1e3:.0f}", f"{times[1]:.2f}x",
        largest_difference(scored["logits"], base["score"]["logits"]), f"{scored['ppl']:.2f}",
        f"{scored['passes']:.2f} ({scored['batch_passes']})" if implicit else "-",
        f"{scored['tol']:.3g}" if implicit else "-", f"{scored['missed']:.1%}" if implicit else "-",
        f"{times[2] * 1e3:.2f}", f"{times[3]:.2f}x", f"{equal} of {NEW_TOKENS}",
        largest_difference(sequential, base_sequential),
        f"{decoded['passes']:.2f}" if implicit else "-", f"{decoded['missed']:.1%}" if implicit else "-",
    ]


@torch.no_grad()
def sequential_logits(model, sequence: torch.Tensor) -> torch.Tensor:
    return model(sequence, mode="sequential").logits.float()


def run(quick: bool, device: str = "cpu") -> Table:
    repeats = 3 if quick else 7
    table = Table(
        f"Half precision against float32: the WikiText-2 pair, scoring {WINDOWS} x {WINDOW} and decoding "
        f"{NEW_TOKENS} tokens after {PROMPT}, {device}, {torch.get_num_threads()} torch threads",
        ["model", "dtype", "score ms", "score / fp32", "score max abs dlogit (rel)", "ppl",
         "passes per solve (of the batch)", "tol", "solves not converged", "decode ms/token", "decode / fp32",
         "tokens = fp32", "sequential max abs dlogit (rel)", "passes per token", "fixed points not converged"],
    )
    reason = missing()
    if reason:
        table.notes.append(reason)
        return table
    prompt, windows = held_out(device)
    for kind in ("implicit", "explicit"):
        models = {dtype: load(kind, dtype, device) for dtype in DTYPES}
        measured = {dtype: figures(model, prompt, windows) for dtype, model in models.items()}
        times = timings(models, prompt, windows, repeats)
        sequence = measured["float32"]["decode"]["sequence"]
        base_sequential = sequential_logits(models["float32"], sequence)
        for dtype, model in models.items():
            table.add(*row(kind, dtype, measured[dtype], measured["float32"], times[dtype],
                           sequential_logits(model, sequence), base_sequential))
    table.notes += [
        f"times: medians of {repeats} runs (decoding {2 * repeats}), each timed in alternation with "
        "float32's; ratios are the medians of the per-pair ratios, the decoding ratio that of the two "
        "differences; float32's own row is float32 against itself, a gauge of the noise",
        "dlogit: the largest |logit - float32's logit| over every position, and that over the largest "
        "|float32 logit|; decoding's is a sequential forward over float32's prompt + generated tokens",
        "passes per solve: the mean over the 8 windows (the batch's passes, run until its "
        "slowest window converged); tol: the tolerance held, the model's 0.01 or the dtype's floor if higher",
        "passes per token: the mean over the decoded tokens' solves; fixed points not converged: "
        "generate()'s tally (the prefill's and every token's)",
    ]
    return table


@torch.no_grad()
def floor_row(model, dtype: str, name: str, mode: str, ids: torch.Tensor) -> list:
    # chunk_length 0: one solve over the whole window, not the chunked solve's retries in
    # halves down to single tokens that a tolerance out of reach sets off.
    chunk = 0 if mode == "simultaneous" else None
    stats = model(ids, mode=mode, max_iter=FLOOR_BUDGET, tol=1e-12, chunk_length=chunk,
                  fixed_point=every_solve_by(name)).fixed_point
    eps = torch.finfo(getattr(torch, dtype)).eps
    reached = stats.rel_residual.float().flatten() / eps
    return [dtype, f"{eps:.3g}", name, f"{mode} {' x '.join(map(str, ids.shape))}", f"{reached.numel()}",
            f"{int((reached == 0).sum())}", f"{reached.median().item():.2f}", f"{reached.max().item():.2f}",
            f"{stats.passes.float().mean().item():.0f}"]


def floors(quick: bool, device: str = "cpu") -> Table:
    """The relative residual reached with the tolerance out of reach, per dtype, solver and mode.
    ``quick`` changes nothing: the budget is what lets the slowest solve reach its floor."""
    table = Table(
        f"Residual floors: the implicit WikiText-2 model solved to 1e-12 with a budget of {FLOOR_BUDGET}, "
        f"no floor under the tolerance, {device}",
        ["dtype", "eps", "solver", "mode", "fixed points", "exactly fixed", "median rel residual / eps",
         "max rel residual / eps", "mean passes"],
    )
    reason = missing()
    if reason:
        table.notes.append(reason)
        return table
    _, windows = held_out(device)
    cases = (("simultaneous", windows[:, :128]), ("sequential", windows[:2, :32]))
    with mock.patch.object(residuals, "RESIDUAL_FLOOR_EPSILONS", 0.0):
        for dtype in DTYPES:
            model = load("implicit", dtype, device)
            for name in FLOOR_SOLVERS:
                for mode, ids in cases:
                    table.add(*floor_row(model, dtype, name, mode, ids))
    table.notes += [
        "rel residual: |f(z) - z| / |f(z)| at the iterate each fixed point returns (a window's in "
        "simultaneous mode, a token's in sequential mode), over the dtype's machine epsilon",
        "exactly fixed: f(z) == z to the last bit, a residual of 0, which is under any tolerance and "
        "ends that fixed point's solve before the budget",
    ]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()  # one bar per checkpoint loaded, nine in all
    print(run(args.quick, args.device).markdown(), flush=True)
    print(floors(args.quick, args.device).markdown())


if __name__ == "__main__":
    main()
