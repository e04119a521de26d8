"""``implicitlm eval length|budget|convergence --task words|lm|catbabi``: one command per
evaluation, over any task; and the task-group shortcuts (``words eval``, ``words convergence``,
``lm eval``, ``catbabi eval``), the same commands with the task fixed and its own options only."""

from __future__ import annotations

from pathlib import Path

from .arguments import (
    add_overwrite_option, budget_list, float_list, fraction, int_list, passes_list, positive_int, seed,
)
from .shared import (
    add_budget_options, add_device_option, add_dtype_option, add_solver_flags, check_model_paths, device_in_use,
    fixed_point_settings, print_device, refuse_beside_passes, tolerance_flags_given,
)

# The options of the tasks, as the library names them; one not given (None) takes the task's default.
TASK_OPTIONS = (
    "data", "group", "lengths", "multiples", "count", "seed", "hard_prob", "prefixes", "split", "max_tokens",
    "sequence_length", "stride", "batch_size",
)
HELP = {
    "length": "quality by test length (length extrapolation): word accuracy, perplexity by context, catbAbI answers",
    "budget": "test-time compute: quality by budget of passes, a curve per test length",
    "convergence": "passes each token needs in sequential mode; hard vs easy tokens (words, lm)",
}


def add_eval(commands) -> None:
    evaluations = commands.add_parser("eval", help="evaluate a checkpoint on a task: --task words, lm or catbabi")
    evaluations = evaluations.add_subparsers(title="commands")
    add_length(evaluations)
    add_budget(evaluations)
    add_convergence(evaluations)


def add_length(commands, name: str = "length", task: str | None = None, help: str | None = None) -> None:
    """``eval length``, or its task-group shortcut ``name`` for ``task`` (``help``: its own words)."""
    p = _parser(commands, name, "length", task, help)
    add_budget_options(p)
    add_solver_flags(p)
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous",
                   help="simultaneous: all tokens solved together (training's way); sequential: token by token, as an RNN")
    # catbabi eval always wrote its record; the others write one when asked.
    p.add_argument("--out", type=Path, default=None, required=task == "catbabi", help=_out_help("length", task))
    add_overwrite_option(p, "a record already in --out")
    p.set_defaults(run=_run_length)


def add_budget(commands) -> None:
    p = _parser(commands, "budget", "budget")
    # The sweep's own lists: apart from the flags of one budget, which fixed_point_settings reads.
    p.add_argument("--max-iter", dest="swept_max_iter", type=budget_list, default=None,
                   help="comma-separated fixed-point budgets, each a point of the sweep (default: 1,2,4,...,64)")
    p.add_argument("--tol", dest="swept_tol", type=float_list, default=None,
                   help="comma-separated tolerances, a curve each (default: the model's)")
    p.add_argument("--passes", dest="swept_passes", type=passes_list, default=None,
                   help="comma-separated numbers of passes: a sweep of exactly K passes per solve instead of budgets "
                        "and tolerances, with the seconds of each point")
    p.add_argument("--explicit", type=Path, action="append", default=[], metavar="CHECKPOINT",
                   help="with --passes: an explicit model scored on the same data, a line beside the curves (repeat "
                        "for several: the explicit twin, a deeper one)")
    p.add_argument("--fixed-point", dest="solved", action="store_true",
                   help="with --passes: the implicit model solved to its tolerance too, a line beside the curves")
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous",
                   help="simultaneous: all tokens solved together (training's way); sequential: token by token, as an RNN")
    add_solver_flags(p)
    p.add_argument("--out", type=Path, required=True, help=_out_help("budget"))
    add_overwrite_option(p, "a record already in --out")
    p.set_defaults(run=_run_budget, check=_check_budget)


def add_convergence(commands, name: str = "convergence", task: str | None = None, help: str | None = None) -> None:
    p = _parser(commands, name, "convergence", task, help)
    add_budget_options(p, passes=False)
    add_solver_flags(p)
    p.add_argument("--out", type=Path, required=True, help=_out_help("convergence", task))
    add_overwrite_option(p, "a record already in --out")
    p.set_defaults(run=_run_convergence)


def add_aliases(commands, task: str) -> None:
    """The shortcuts for ``task``'s evaluations in its command group (``words eval`` ...); a
    budget sweep, and an LM's convergence report, are ``eval budget|convergence --task`` alone."""
    from ..tasks import TASKS  # the table alone, without torch

    adders = {"length": add_length, "convergence": add_convergence}
    for name, evaluation, help in TASKS[task].aliases:
        adders[evaluation](commands, name, task, help)


def _run_length(args) -> None:
    from ..eval.length import evaluate_by_length

    task = _task(args)
    _report(evaluate_by_length(task, args.mode, args.out, progress=not args.no_progress, overwrite=args.overwrite), task)


def _check_budget(args) -> None:
    from ..core.errors import OptionError

    for flag, given in (("explicit", args.explicit), ("fixed_point", args.solved)):
        if args.swept_passes is None and given:
            raise OptionError(f"{flag} is drawn beside a sweep of passes: give passes", arguments=(flag, "passes"))
    if args.swept_passes is not None:
        swept = [name for name, values in (("max_iter", args.swept_max_iter), ("tol", args.swept_tol)) if values]
        refuse_beside_passes("passes (a sweep of fixed budgets)", swept + tolerance_flags_given(args))
    check_model_paths(args)


def _run_budget(args) -> None:
    from ..eval.budget import budget_by_task, passes_by_task

    task = _task(args)
    if args.swept_passes is None:
        _report(budget_by_task(task, args.swept_max_iter or [1, 2, 4, 8, 16, 32, 64], args.swept_tol, args.mode,
                               args.out, progress=not args.no_progress, overwrite=args.overwrite), task)
        return
    twins = [_task(args, checkpoint) for checkpoint in args.explicit]
    _report(passes_by_task(task, args.swept_passes, twins, args.mode, args.out, progress=not args.no_progress,
                           overwrite=args.overwrite, solved=args.solved), task)


def _run_convergence(args) -> None:
    from ..eval.convergence import convergence_by_task

    task = _task(args)
    _report(convergence_by_task(task, args.out, progress=not args.no_progress, overwrite=args.overwrite), task)


def _task(args, checkpoint: Path | None = None):
    """The task the command names, on its checkpoint (or ``checkpoint``), with the options given."""
    from ..tasks import make_task

    options = {name: getattr(args, name, None) for name in TASK_OPTIONS}
    task = make_task(args.task, checkpoint or args.checkpoint, dtype=args.dtype, device=device_in_use(args), **options)
    return task.solve_with(**fixed_point_settings(args))


def _report(result, task) -> None:
    print_device(str(task.device))
    print(result["table"])
    if result["files"]:
        record, figure = result["files"]
        print(f"results: {record}, plot: {figure}")


def _parser(commands, name: str, evaluation: str, task: str | None = None, help: str | None = None):
    from ..tasks import TASKS  # the table alone, without torch

    if task is None:
        p = commands.add_parser(name, help=HELP[evaluation], description=HELP[evaluation])
        p.add_argument("--task", required=True, choices=tuple(TASKS), help="what the checkpoint is evaluated on")
    else:
        same = f"same as implicitlm eval {evaluation} --task {task}"
        p = commands.add_parser(name, help=f"{help}; {same}", description=f"{help}; {same}")
        p.set_defaults(task=task)
    _add_task_options(p, task, evaluation)
    p.set_defaults(check=check_model_paths)
    return p


def _add_task_options(p, task: str | None, evaluation: str) -> None:
    """The options of ``task`` (of every task when None, each help naming the tasks it is for)."""
    from ..tasks import TASKS  # the table alone, without torch

    def takes(*tasks: str) -> str | None:
        """The help's prefix for an option of ``tasks``, or None when ``task`` is not one."""
        if task is None:
            return f"({', '.join(tasks)}) " if len(tasks) < len(TASKS) else ""
        return "" if task in tasks else None

    p.add_argument("checkpoint", type=Path)
    folders = {"words": "test words file(s) instead (repeatable)", "lm": "shard folder",
               "catbabi": "catbAbI folder (implicitlm catbabi build)"}
    data_help = folders.get(task) or "; ".join(f"{name}: {text}" for name, text in folders.items())
    p.add_argument("--data", type=Path, action="append", default=None, required=task in ("lm", "catbabi"), help=data_help)
    count = 64 if evaluation == "convergence" else 512
    if (words := takes("words")) is not None:
        p.add_argument("--group", default=None, help=f"{words}group of generated test words (default: from the checkpoint)")
    if (both := takes("words", "lm")) is not None:
        lengths = p.add_mutually_exclusive_group()
        lengths.add_argument("--lengths", type=int_list, default=None,
                             help=f"{both}comma-separated test lengths (lm: context lengths, default: the training context); "
                                  "an evaluation whose lengths take more than a day here, timed on a forward at one pass, "
                                  "is refused before any is read")
        lengths.add_argument("--multiples", type=int_list, default=None,
                             help=f"{both}test lengths as multiples of the training length, e.g. 1,2,4,8")
    if words is not None:
        p.add_argument("--count", type=positive_int, default=None, help=f"{words}generated words per length (default: {count})")
        p.add_argument("--seed", type=seed, default=None, help=f"{words}seed of the generated words (default: 0)")
        p.add_argument("--hard-prob", type=fraction, default=None,
                       help=f"{words}identity probability of the group part (A5xM; default: the training's)")
        if evaluation == "length":
            p.add_argument("--prefixes", action="store_true", default=None,
                           help=f"{words}draw the longest length's words only and score every length on their "
                                "prefixes, in one read: the cost of the longest length alone")
    if (split := takes("lm", "catbabi")) is not None:
        choices = ["train", "valid", "test"] if task == "catbabi" else None
        p.add_argument("--split", default=None, choices=choices,
                       help=f"{split}held-out split: of the shards (lm), bAbI train, valid or test (catbabi); default: test")
    if (lm := takes("lm")) is not None:
        scored = "tokens counted (default: 4096)" if evaluation == "convergence" else "tokens scored per length (default: the whole split)"
        p.add_argument("--max-tokens", type=positive_int, default=None, help=f"{lm}{scored}")
    if (catbabi := takes("catbabi")) is not None:
        p.add_argument("--sequence-length", type=positive_int, default=None, help=f"{catbabi}window length (default: 256)")
        p.add_argument("--stride", type=positive_int, default=None,
                       help=f"{catbabi}window step; every answer sees at least sequence-length - stride tokens before it "
                            "(default: half the window)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"sequences per batch (default: {TASKS[task].batch_size if task else _batch_sizes(TASKS)})")
    add_device_option(p)
    add_dtype_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _batch_sizes(tasks) -> str:
    """Each task's default batch size, tasks of the same one together: "256 for words, 8 for lm and catbabi"."""
    by_size: dict[int, list[str]] = {}
    for name, entry in tasks.items():
        by_size.setdefault(entry.batch_size, []).append(name)
    return ", ".join(f"{size} for {' and '.join(names)}" for size, names in by_size.items())


def _out_help(evaluation: str, task: str | None = None) -> str:
    """The help of --out, naming the record ``evaluation`` writes (of ``task``, or of each task)."""
    from ..tasks import TASKS  # the table alone, without torch

    records = {name: entry.records[evaluation] for name, entry in TASKS.items() if evaluation in entry.records}
    if task is not None:
        return f"folder for {records[task]}.json and {records[task]}.png"
    names = list(dict.fromkeys(records.values()))
    return f"folder for the task's record and figure ({' or '.join(names)}: .json and .png)"
