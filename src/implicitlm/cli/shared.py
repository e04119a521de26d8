"""What the commands of several groups share: budget and solver flags, the resume/overwrite
check, the demo commands' options and report, a training run's summary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from .arguments import (
    add_overwrite_option, device_name, dtype_name, max_iter_budget, non_negative_int, pass_budget, positive_float,
    preset_name,
)


def add_budget_options(p, passes: bool = True) -> None:
    """``--max-iter`` and ``--tol``; with ``passes``, ``--passes`` too (an evaluation that measures
    the solve to the tolerance itself, as convergence statistics do, takes none)."""
    p.add_argument("--max-iter", type=max_iter_budget, default=None, help="fixed-point budget (default: the model's max_iter)")
    p.add_argument("--tol", type=positive_float, default=None, help="fixed-point tolerance (default: the model's)")
    if passes:
        p.add_argument("--passes", type=pass_budget, default=None,
                       help="exactly this many passes per solve, from the learned guess where the model uses one, no "
                            "tolerance and no retries (0: solve to --tol; default: the model's passes, 0 where a flag "
                            "of a solve to the tolerance is given: --max-iter, --tol, --solver, --retry-depth, "
                            "--fail-on-nonconvergence, each refused beside a --passes above 0)")


def add_dtype_option(p) -> None:
    p.add_argument("--dtype", type=dtype_name, default=None,
                   help="the model's dtype: float32, bfloat16, float16 or float64 (default: as saved)")


def add_device_option(p) -> None:
    p.add_argument("--device", type=device_name, default="auto",
                   help="cpu, cuda, cuda:1, ... (default: auto, a GPU where torch sees one, else the CPU)")


def device_in_use(args) -> str:
    """The device ``--device`` names on this machine (auto: cuda or cpu), refused in one line
    before anything loads if the machine lacks it. A default that picks for the user says what
    it picked: each command says it with its output (``print_device``), and its records name it."""
    from ..core.devices import usable_device

    return str(usable_device(args.device))


def print_device(device: str, file=None) -> None:
    # With the output, not before the work: a refusal on the way stays the one line it is.
    print(f"device: {device}", file=file)


def add_solver_flags(p) -> None:
    """How an evaluation's solves run, besides their budget: ``fixed_point_settings`` reads them."""
    p.add_argument("--fail-on-nonconvergence", action="store_true",
                   help="stop with exit code 1 if any sample or token misses the tolerance (default: count them)")
    p.add_argument("--chunk-length", type=non_negative_int, default=None,
                   help="simultaneous mode solves in chunks of this many tokens, carrying the state "
                        "(0: the whole sequence; default: the model's chunk_length, its training length)")
    p.add_argument("--retry-depth", type=non_negative_int, default=None,
                   help="a chunk's rows that miss the tolerance are solved again in chunks of half the length, at most "
                        "this many times over (0: never; default: the model's retry_depth, 3: at most 14 times a "
                        "chunk's budget more)")
    from ..core.option_names import INITIAL_GUESSES  # deq.options' own, without torch

    p.add_argument("--solver", default=None,
                   help="fixed-point solver of every solve in this run, one of solver's (implicitlm options); it "
                        "starts every solve from z = 0, as if with --initial-guess zero, unless --initial-guess "
                        "learned is given too (default: the model's, per mode)")
    p.add_argument("--initial-guess", choices=INITIAL_GUESSES, default=None,
                   help="where each solve starts: z = 0, or the checkpoint's learned guess (implicitlm solver train; "
                        "default: learned where the checkpoint has one, zero with --solver)")


def fixed_point_settings(args) -> dict[str, Any]:
    """The fixed-point flags given (``add_budget_options``, ``add_solver_flags``), as the
    ``FixedPointOptions`` fields they stand for: the flag ``--max-iter`` is the field
    ``max_iter``. A budget or solver given holds in both modes, so it clears the per-mode one;
    a flag of a solve to the tolerance (``TOLERANCE_FLAGS``) asks for one, passes 0, and beside
    a ``--passes`` above 0 is refused: it would be dropped, a budget of K passes holding no
    tolerance; a ``--solver`` starts from z = 0, unless ``--initial-guess`` says otherwise."""
    from ..deq.options import every_solve_by

    given = tolerance_flags_given(args)
    passes = getattr(args, "passes", None)
    if passes:
        refuse_beside_passes(f"passes={passes}", given)
    settings: dict[str, Any] = {"passes": 0} if given else {}
    if getattr(args, "max_iter", None) is not None:
        settings.update(max_iter=args.max_iter, simultaneous_max_iter=0)
    if getattr(args, "tol", None) is not None:
        settings["tol"] = args.tol
    if passes is not None:
        settings["passes"] = passes
    if getattr(args, "retry_depth", None) is not None:
        settings["retry_depth"] = args.retry_depth
    if getattr(args, "chunk_length", None) is not None:
        settings["chunk_length"] = args.chunk_length
    if getattr(args, "solver", None) is not None:
        settings.update(every_solve_by(args.solver))
    # A solver named on its own is measured on its own: from z = 0, whatever start the
    # checkpoint chose per mode, so that its passes compare with another solver's and its
    # records name it alone (not "+learned_guess"); --initial-guess learned adds the guess.
    initial_guess = getattr(args, "initial_guess", None) or ("zero" if getattr(args, "solver", None) else None)
    if initial_guess is not None:
        settings.update(initial_guess=initial_guess, simultaneous_initial_guess="", sequential_initial_guess="")
    if getattr(args, "fail_on_nonconvergence", False):
        settings["nonconvergence"] = "error"
    return settings


# The flags of a solve to the tolerance, as the library names them: what a budget of K passes
# has no use for (no tolerance to solve to, to retry or to miss).
TOLERANCE_FLAGS = ("max_iter", "tol", "solver", "retry_depth", "fail_on_nonconvergence")


def tolerance_flags_given(args, names: tuple[str, ...] = TOLERANCE_FLAGS) -> list[str]:
    """Those of ``names`` the command line gave (the attribute of each, by its name)."""
    # A value of 0 (--retry-depth 0) is given; False is a switch left off.
    return [name for name in names if getattr(args, name, None) is not None and getattr(args, name) is not False]


def refuse_beside_passes(passes: str, given: list[str]) -> None:
    """Refuse, in one line, flags of a solve to the tolerance (``given``) beside a budget of
    passes (``passes``, as the message names it: ``passes=2``)."""
    from ..core.errors import OptionError

    if given:
        raise OptionError(
            f"{passes} holds no tolerance to solve to, retry or miss: {', '.join(given)} "
            f"{'is' if len(given) == 1 else 'are'} for a solve to the tolerance (passes=0); give one or the other",
            arguments=("passes", *given))


def check_model_paths(args) -> None:
    """The models a command loads (its checkpoint, --init-from, --explicit), by their files: the
    ``check`` the command line runs before it imports torch (seconds), so that a path holding
    no model is refused at once, saying what it holds."""
    from ..core.run_folder import check_model_location

    explicit = getattr(args, "explicit", None)  # words train's --explicit is a flag, eval budget's a list
    for path in [getattr(args, "checkpoint", None), getattr(args, "init_from", None),
                 *(explicit if isinstance(explicit, list) else [])]:
        if path is not None:
            check_model_location(path)


def check_run_options(args) -> None:
    """A training command's ``check``: its models, and --resume, which continues a run in --out
    (one found there, not a checkpoint of it or a folder of runs) and cannot go with --overwrite."""
    from ..core.errors import OptionError
    from ..core.run_folder import check_resume_target

    if args.resume and args.overwrite:
        raise OptionError("--resume continues the run in --out and --overwrite replaces it: pass one")
    check_model_paths(args)
    # --resume with --init-from is a pair the library refuses by name, whatever --out holds.
    if args.resume and getattr(args, "init_from", None) is None:
        check_resume_target(args.out)


def add_demo_command(commands, help_text: str, preset: str, run: Callable) -> None:
    """A ``demo`` command: a preset in, a table, ``results.json`` and a plot out."""
    p = commands.add_parser("demo", help=help_text)
    p.add_argument("--out", type=Path, default=Path(f"{preset}_out"), help=f"output folder (default: {preset}_out)")
    p.add_argument("--preset", type=preset_name, default=preset, help=f"preset name or JSON file (default: {preset})")
    add_overwrite_option(p, "what an earlier run of it wrote in --out (other files stay)")
    add_device_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=run)


def report_demo(args, run_demo: Callable, format_table: Callable, plot: str) -> None:
    """Run a demo command's library function and print its table, what it took and where its
    files are."""
    from ..presets import load_preset
    from ..train.loop import duration

    device = device_in_use(args)
    results = run_demo(load_preset(args.preset), args.out, progress=not args.no_progress, overwrite=args.overwrite,
                       device=device)
    print_device(device)
    print(format_table(results))
    print(f"took {duration(results['wall_seconds'])}, {duration(results['cpu_seconds'])} of CPU time (user + system)")
    print(f"results: {args.out / 'results.json'}, plot: {args.out / plot}")


def print_run_summary(metrics: dict[str, Any], out: Path, device: str) -> None:
    """A finished training run's device, last metrics, its held-out perplexity, what it
    trained and where its checkpoints are, printed once: under torchrun by the first process
    only."""
    from ..core.run_folder import latest_checkpoint
    from ..train.loop import duration

    if os.environ.get("RANK", "0") != "0":
        return
    print_device(device)
    final = f"final loss {metrics['loss']:.4f}"
    if "ppl" in metrics:
        final += f" (perplexity {metrics['ppl']:.2f})"
    if "accuracy" in metrics:
        final += f", accuracy {metrics['accuracy']:.1%}"
    print(f"trained {metrics['steps']:,} steps, {metrics['tokens']:,} tokens in {duration(metrics['seconds'])}; {final}")
    if "test_ppl" in metrics:
        print(f"held-out perplexity {metrics['test_ppl']:.2f} (loss {metrics['test_loss']:.4f})")
    print(f"checkpoints: {out / 'checkpoints'} (latest: {latest_checkpoint(out)})")
