"""Downstream scores against the solver's tolerance: what a looser tolerance saves in time and costs in scores.

    python benchmarks/tolerance.py CHECKPOINT --data-dir ../shared/data [--limit 50]
        [--tols 0.05,0.01,1e-3,1e-4] [--reference-tol 1e-5] [--budget 256] [--solver NAME]
        [--starts zero,learned] [--out FILE]

A study of one trained implicit checkpoint, not a section of ``run.py`` (a random model's
scores say nothing). The paper's downstream tasks whose files ``--data-dir`` holds are
scored by lm-eval, the first ``--limit`` documents of each, once per tolerance and once at
``--reference-tol`` (the converged solve every other run is compared with, paired, on the
same documents): the accuracies, how many documents' chosen answer (LAMBADA: its greedy
match) differs from the converged solve's, how far each request's log-likelihood moves,
the share of fixed points that stopped above their tolerance, and the wall time. ``--starts``:
each tolerance from z = 0 and, for a checkpoint with one (``implicitlm solver train``), from
its learned initial guess; the reference always from z = 0.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
from common import Table

from implicitlm.deq.options import every_solve_by
from implicitlm.eval.downstream import PAPER_TASKS, read_local_sets, run_tasks
from implicitlm.models import load_model


def scored(model, tasks, local_sets, limit: int, tol: float, budget: int, batch_size: int, start: str = "zero",
           solver: str | None = None) -> dict:
    """lm-eval's results with every document's scores, the wall time, the convergence tally;
    each solve from ``start`` (zero, or the learned initial guess), by ``solver`` (None: the model's)."""
    starting = {**(every_solve_by(solver) if solver else {}),
                "initial_guess": start, "simultaneous_initial_guess": "", "sequential_initial_guess": ""}
    began = time.perf_counter()
    with model.track_convergence() as tally:
        results = run_tasks(model, tasks, limit=limit, local_sets=local_sets, log_samples=True, bootstrap_iters=0,
                            tol=tol, max_iter=budget, batch_size=batch_size, progress=False, fixed_point=starting)
    return {"results": results, "seconds": time.perf_counter() - began, "tally": tally}


def choices(sample: dict) -> tuple[list[float], int]:
    """A document's log-likelihoods (one per request) and what it answers: the index of
    the likeliest choice, or for a single request (LAMBADA) whether it is the greedy text."""
    responses = [response[0] if isinstance(response[0], (tuple, list)) else response for response in sample["resps"]]
    lls = [float(ll) for ll, _ in responses]
    answer = int(bool(responses[0][1])) if len(responses) == 1 else max(range(len(lls)), key=lls.__getitem__)
    return lls, answer


def compare(run: dict, reference: dict) -> dict:
    """Paired with the reference: answers that changed, and the log-likelihoods' deviations."""
    changed = documents = 0
    deviations = []
    for task, samples in reference["results"]["samples"].items():
        by_doc = {sample["doc_id"]: sample for sample in run["results"]["samples"][task]}
        for sample in samples:
            ref_lls, ref_answer = choices(sample)
            lls, answer = choices(by_doc[sample["doc_id"]])
            documents += 1
            changed += answer != ref_answer
            deviations += [abs(a - b) for a, b in zip(lls, ref_lls)]
    return {"changed": changed, "documents": documents, "mean": statistics.fmean(deviations), "max": max(deviations)}


def accuracy(results: dict, task: str) -> float:
    return float(results["results"][task]["acc,none"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=50, help="documents per task")
    parser.add_argument("--tols", default="0.05,0.01,1e-3,1e-4")
    parser.add_argument("--reference-tol", type=float, default=1e-5)
    parser.add_argument("--budget", type=int, default=256, help="most passes per solve, at every tolerance")
    parser.add_argument("--solver", default=None, help="solver of every solve (default: the model's, per mode)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--starts", default="zero", help="zero, and learned where the checkpoint has a guess")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args()
    model = load_model(args.checkpoint).eval()
    local_sets, _ = read_local_sets(list(PAPER_TASKS), args.data_dir, skip_missing=True)
    tasks = list(local_sets)
    tols = [float(t) for t in args.tols.split(",")]
    reference = scored(model, tasks, local_sets, args.limit, args.reference_tol, args.budget, args.batch_size,
                       solver=args.solver)
    starts = [start for start in args.starts.split(",") if start == "zero" or model.learned_guess is not None]
    runs = {(tol, start): scored(model, tasks, local_sets, args.limit, tol, args.budget, args.batch_size, start,
                                 args.solver)
            for tol in tols for start in starts}
    table = Table(
        f"Downstream scores by solver tolerance: {args.checkpoint}, first {args.limit} documents of "
        f"{', '.join(tasks)}, budget {args.budget}, {torch.get_num_threads()} torch threads",
        ["tolerance", "start", "s", "time / reference", "not converged", *[f"{task} acc" for task in tasks], "average acc",
         "answers changed", "mean abs dLL", "max abs dLL"],
    )
    for (tol, start), run in [((args.reference_tol, "zero"), reference), *runs.items()]:
        accs = [accuracy(run["results"], task) for task in tasks]
        paired = compare(run, reference)
        table.add(
            f"{tol:g}" + (" (reference)" if run is reference else ""), start, f"{run['seconds']:.0f}",
            f"{run['seconds'] / reference['seconds']:.2f}x", f"{run['tally'].not_converged_share:.2%}",
            *[f"{a:.3f}" for a in accs], f"{statistics.fmean(accs):.3f}",
            f"{paired['changed']} of {paired['documents']}", f"{paired['mean']:.2g}", f"{paired['max']:.2g}",
        )
    worst = max(math.sqrt(accuracy(reference["results"], t) * (1 - accuracy(reference["results"], t)) / args.limit)
                for t in tasks)
    table.notes.append(f"standard error of one task's accuracy on {args.limit} documents: up to {worst:.3f}; "
                       "answers changed and dLL are paired with the reference on the same documents")
    table.publish(args.out)


if __name__ == "__main__":
    main()
