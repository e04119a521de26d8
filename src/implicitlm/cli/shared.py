"""What the commands of several groups share: budget and solver flags, the resume/overwrite
check."""

from __future__ import annotations

from typing import Any

from .arguments import non_negative_int, positive_float, positive_int


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


def solver_flags(args) -> dict[str, Any]:
    """The flags ``add_solver_flags`` adds, as ``tasks.base.configure_solver``'s keywords."""
    return {"fail_on_nonconvergence": args.fail_on_nonconvergence, "chunk_length": args.chunk_length, "solver": args.solver}


def apply_solver_flags(model, args) -> None:
    from ..tasks.base import configure_solver

    configure_solver(model, **solver_flags(args))


def check_resume_or_overwrite(args) -> None:
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it: pass one")
