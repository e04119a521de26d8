"""``implicitlm train`` and ``implicitlm lm ...``: language models."""

from __future__ import annotations

import sys
from pathlib import Path

from .arguments import (
    add_overwrite_option, add_run_options, model_preset_name, non_negative_int, positive_float, positive_int, preset_name,
    tokenizer_name,
)
from .shared import (
    add_budget_options, add_demo_command, add_device_option, add_dtype_option, add_solver_flags, check_model_paths,
    check_run_options, device_in_use, fixed_point_settings, print_device, print_run_summary, report_demo,
)


def add_train(commands) -> None:
    p = commands.add_parser("train", help="train a language model on token shards (torchrun for several processes)")
    p.add_argument("--data", type=Path, required=True, help="shard folder (implicitlm corpus build)")
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoints, metrics.jsonl, tensorboard")
    p.add_argument("--model-preset", type=model_preset_name, default=None, help="model preset (implicitlm models list) or JSON file")
    p.add_argument(
        "--config", dest="preset", type=preset_name, default=None,
        help="training preset name, JSON with 'model' and 'train' sections (and 'explicit_model' / 'implicit_model'), "
             "or a checkpoint",
    )
    p.add_argument(
        "--init-from", type=Path, default=None, metavar="CHECKPOINT",
        help="start from this checkpoint's (or run's) model and weights, --model options on top (implicit=true turns "
             "an explicit model implicit, its injection set from block 1); on the same shards the batches go on where "
             "its run stopped, so the new run sees further tokens",
    )
    add_run_options(p, "lm")
    add_device_option(p)
    p.set_defaults(run=_run_train, check=check_run_options)


def _run_train(args) -> None:
    from ..train.runs import train_lm_run

    device = device_in_use(args)
    metrics = train_lm_run(
        args.data, args.out, preset=args.preset, model_preset=args.model_preset, model_options=dict(args.model),
        train_options=dict(args.train), init_from=args.init_from, resume=args.resume, overwrite=args.overwrite,
        progress=not args.no_progress, device=device,
    )
    print_run_summary(metrics, args.out, device)


def add_lm_demo(commands) -> None:
    add_demo_command(commands, "explicit vs implicit Mamba2 on Python's standard library, on CPU", "lm_demo", _run_lm_demo)


def _run_lm_demo(args) -> None:
    from ..recipes.lm import format_lm_table, run_lm_demo

    report_demo(args, run_lm_demo, format_lm_table, "perplexity.png")


def add_lm_downstream(commands) -> None:
    p = commands.add_parser("downstream", help="zero-shot tasks through lm-evaluation-harness, as the paper's table")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--tasks", default=None, help="comma-separated lm-eval tasks (default: the paper's: lambada_openai,"
                   "hellaswag,piqa,arc_easy,arc_challenge,winogrande,openbookqa)")
    p.add_argument("--include-path", type=Path, default=None, help="folder of further task definitions (YAML)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="read the tasks' documents from this folder instead of the hub (layout: lambada/, hellaswag/, "
                        "piqa/, arc/, winogrande/, openbookqa/ as the handbook's evaluation guide says); without --tasks, "
                        "the paper's tasks whose files are missing are skipped with a warning")
    p.add_argument("--limit", type=positive_float, default=None, help="documents per task (a fraction if below 1): quick checks only")
    p.add_argument("--num-fewshot", type=non_negative_int, default=None, help="examples in each prompt (default: the task's, mostly 0)")
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous",
                   help="simultaneous: all tokens solved together (training's way); sequential: token by token, as an RNN")
    add_budget_options(p)
    add_solver_flags(p)
    p.add_argument("--batch-size", type=positive_int, default=8, help="documents per forward (default: 8)")
    p.add_argument("--max-length", type=positive_int, default=None, help="context window in tokens (default: 2048)")
    p.add_argument("--tokenizer", type=tokenizer_name, default=None, help="tokenizer folder or hub name (default: the checkpoint's)")
    add_device_option(p)
    add_dtype_option(p)
    p.add_argument("--out", type=Path, required=True, help="folder for downstream.json and downstream.png")
    add_overwrite_option(p, "a record already in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_lm_downstream, check=check_model_paths)


def _run_lm_downstream(args) -> None:
    from ..core.errors import OptionError

    try:
        from lm_eval.utils import make_table
    except ImportError:
        raise OptionError("lm downstream needs lm-eval: pip install 'implicitlm[eval]'") from None

    from ..eval.downstream import EXPERIMENT
    from ..eval.records import claimed_records

    # Before the tasks are scored, not after: minutes of scoring lost to a record already there.
    with claimed_records(args.out, [EXPERIMENT], args.overwrite):
        _score_downstream(args, make_table)


def _score_downstream(args, make_table) -> None:
    from ..core.errors import NetworkError
    from ..eval.downstream import PAPER_TASKS, downstream_record, paper_table, read_local_sets, run_tasks
    from ..models import load_model

    device = device_in_use(args)  # before the model loads: a device this machine lacks costs nothing
    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()] if args.tasks else list(PAPER_TASKS)
    local_sets, skipped = None, {}
    if args.data_dir is not None:
        local_sets, skipped = read_local_sets(tasks, args.data_dir, skip_missing=not args.tasks)
        for reason in skipped.values():
            print(f"warning: skipped {reason}", file=sys.stderr)
        tasks = list(local_sets)
    model = load_model(args.checkpoint)
    fixed_point = fixed_point_settings(args)  # every forward's; the checkpoint's own stay as saved
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    settings = {"mode": args.mode, "batch_size": args.batch_size, "max_length": args.max_length,
                "device": device, "dtype": args.dtype}
    try:
        results = run_tasks(model, tasks, limit=limit, include_path=args.include_path, num_fewshot=args.num_fewshot,
                            tokenizer=args.tokenizer, progress=not args.no_progress, local_sets=local_sets,
                            fixed_point=fixed_point, **settings)
    except ConnectionError as error:
        if local_sets is not None:
            raise
        raise NetworkError(f"{error}; without a network, read local copies with --data-dir DIR") from None
    print_device(device)
    print(make_table(results))
    if any(task in PAPER_TASKS for task in tasks):
        print(paper_table(results)[1])
    data = {"data_dir": str(args.data_dir), "skipped": skipped} if args.data_dir is not None else {"data_dir": None}
    # The budget as solved: the model's own, or as --max-iter / --tol / --passes set it.
    options = model.fixed_point_options(fixed_point)
    budget = {**dict(zip(("max_iter", "tol"), options.budget(None, None, args.mode))),
              "passes": options.passes} if model.config.implicit else {}
    downstream_record(model, args.checkpoint, results, args.out, fixed_point, tasks=tasks, limit=limit, **data,
                      **settings, **budget)
    print(f"results: {args.out / 'downstream.json'}, plot: {args.out / 'downstream.png'}")
