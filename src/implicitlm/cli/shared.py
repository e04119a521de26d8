"""What the evaluation commands of several groups share: solver flags, budget sweeps,
convergence reports and their tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .arguments import float_list, int_list, non_negative_int, positive_float, positive_int


def add_budget_options(p) -> None:
    p.add_argument("--max-iter", type=positive_int, default=None, help="fixed-point budget (default: the model's eval budget)")
    p.add_argument("--tol", type=positive_float, default=None, help="fixed-point tolerance (default: the model's)")


def add_solver_flags(p) -> None:
    """How an evaluation's solves run, besides their budget: ``apply_solver_flags`` sets them."""
    p.add_argument("--fail-on-nonconvergence", action="store_true",
                   help="stop with exit code 1 if any sample or token misses the tolerance (default: count them)")
    p.add_argument("--chunk-length", type=non_negative_int, default=None,
                   help="simultaneous mode solves in chunks of this many tokens, carrying the state "
                        "(0: the whole sequence; default: the model's eval_chunk_length, its training length)")
    p.add_argument("--solver", default=None,
                   help="fixed-point solver of every solve in this run, one of f_solver's (implicitlm options) "
                        "(default: the model's, per mode)")


def apply_solver_flags(model, args) -> None:
    if args.fail_on_nonconvergence:
        model.set_fixed_point_options(eval_nonconvergence="error")
    if args.chunk_length is not None:
        model.set_fixed_point_options(eval_chunk_length=args.chunk_length)
    if args.solver is not None:
        model.use_solver(args.solver)


def add_sweep_options(p, experiment: str) -> None:
    p.add_argument("--budgets", type=int_list, default=[1, 2, 4, 8, 16, 32, 64], help="comma-separated max_iter values")
    p.add_argument("--tols", type=float_list, default=None, help="comma-separated tolerances (default: the model's)")
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    add_solver_flags(p)
    p.add_argument("--out", type=Path, required=True, help=f"folder for {experiment}.json and {experiment}.png")


def run_sweep(args, model, evaluate, experiment: str, quality: str, title: str, **details) -> None:
    """The budget sweep of a ``budget`` command: table, record and figure."""
    from ..eval.budget import budget_record, budget_sweep

    apply_solver_flags(model, args)
    rows = budget_sweep(evaluate, args.budgets, args.tols or [None], progress=not args.no_progress)
    _print_budget_table(rows, quality)
    title = f"{title} ({args.mode} mode)"
    budget_record(experiment, model, args.checkpoint, rows, quality, args.out, title, mode=args.mode, **details)
    print(f"results: {args.out / f'{experiment}.json'}, plot: {args.out / f'{experiment}.png'}")


def add_convergence_options(p) -> None:
    add_budget_options(p)
    add_solver_flags(p)
    p.add_argument("--out", type=Path, required=True, help="folder for convergence.json and convergence.png")


def prepare_convergence(model, args) -> None:
    """An implicit model, running the solver ``--solver`` names (else its own)."""
    require_implicit(model, "convergence statistics")
    apply_solver_flags(model, args)


def report_convergence(args, model, summary: dict[str, Any], title: str, **details) -> None:
    from ..eval.convergence import convergence_record

    _print_convergence(summary)
    convergence_record(model, args.checkpoint, summary, args.out, title, **details)
    print(f"results: {args.out / 'convergence.json'}, plot: {args.out / 'convergence.png'}")


def check_resume_or_overwrite(args) -> None:
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it: pass one")


def training_settings(checkpoint: Path) -> dict[str, Any]:
    """The training options a checkpoint records; none for an imported or hand-made model."""
    from ..train.checkpoint import TRAINER_META, read_meta

    return read_meta(checkpoint).get("train", {}) if (checkpoint / TRAINER_META).is_file() else {}


def require_implicit(model, what: str) -> None:
    if not model.config.implicit:
        raise ValueError(f"{what} needs an implicit model; this checkpoint is explicit")


def progress_bar(items: list, args) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc="eval", disable=args.no_progress)


def _print_budget_table(rows: list[dict[str, Any]], quality: str) -> None:
    width = max(12, len(quality) + 2)
    print(f"{'length':>8}{'tol':>9}{'max_iter':>10}{quality:>{width}}{'iters used':>12}{'not converged':>15}")
    for row in rows:
        tol = "model" if row["tol"] is None else f"{row['tol']:g}"
        used = f"{row['fp_iterations_mean']:>12.2f}" if "fp_iterations_mean" in row else f"{'-':>12}"
        print(f"{row['length']:>8}{tol:>9}{row['max_iter']:>10}{row[quality]:>{width}.4f}{used}{missed_cell(row)}")


def missed_cell(row: dict[str, Any]) -> str:
    """The "not converged" column: the share of fixed points above the tolerance ("-": explicit)."""
    return f"{row['fp_not_converged_share']:>15.2%}" if "fp_not_converged_share" in row else f"{'-':>15}"


def _print_convergence(summary: dict[str, Any]) -> None:
    print(f"budget {summary['max_iter']}, tolerance {summary['tol']:g}")
    # unconverged / diverged: token counts short of the tolerance, after the whole budget / given up before it.
    print(f"{'tokens':<8}{'count':>9}{'mean':>8}{'median':>8}{'p90':>7}{'full budget':>13}{'unconverged':>13}"
          f"{'diverged':>10}")
    for group in ("all", "hard", "easy"):
        stats = summary.get(group)
        if stats and stats["tokens"]:
            print(
                f"{group:<8}{stats['tokens']:>9,}{stats['iterations_mean']:>8.2f}{stats['iterations_median']:>8.1f}"
                f"{stats['iterations_p90']:>7.1f}{stats['share_full_budget']:>13.1%}{stats['unconverged']:>13,}"
                f"{stats['diverged']:>10,}"
            )
