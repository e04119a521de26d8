"""``implicitlm train`` and ``implicitlm lm ...``: language models."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .arguments import int_list, key_value, non_negative_int, options_epilog, positive_float, positive_int
from .shared import (
    add_budget_options, add_convergence_options, add_solver_flags, add_sweep_options,
    apply_solver_flags, check_resume_or_overwrite, missed_cell, prepare_convergence, report_convergence,
    require_implicit, run_sweep, training_settings,
)


def add_train(commands) -> None:
    p = commands.add_parser("train", help="train a language model on token shards (torchrun for several processes)")
    p.add_argument("--data", type=Path, required=True, help="shard folder (implicitlm corpus build)")
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoints, metrics.jsonl, tensorboard")
    p.add_argument("--model-preset", default=None, help="model preset (implicitlm models list) or JSON file")
    p.add_argument(
        "--config", default=None,
        help="training preset name or JSON with 'model' and 'train' sections (and 'explicit_model' / 'implicit_model')",
    )
    p.add_argument("--model", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.add_argument("--train", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="training option, repeatable")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out (refused without it)")
    p.add_argument("--no-progress", action="store_true")
    p.epilog = options_epilog("lm")
    p.set_defaults(run=_run_train)


def _run_train(args) -> None:
    import torch

    from ..data.shards import TokenShards
    from ..models import build_model, config_from_options, load_model
    from ..presets import load_preset, merged_options, model_kind, model_options_from
    from ..train.checkpoint import latest_checkpoint
    from ..train.lm_trainer import CHECKPOINTS, LMTrainConfig, resume_config, train_lm

    check_resume_or_overwrite(args)
    preset = load_preset(args.config) if args.config else {}
    if args.resume:
        # The run's own settings, with any given on the command line on top.
        train = resume_config(args.out, dict(args.train))
        model = load_model(latest_checkpoint(args.out / CHECKPOINTS))
    else:
        command_line = dict(args.model)
        base = model_options_from(args.model_preset) if args.model_preset else {}
        # A preset's "explicit_model" / "implicit_model" section holds the widths that give both
        # kinds the same number of parameters; the command line still has the last word.
        kind = model_kind(preset, command_line, base)
        train = LMTrainConfig.from_dict(merged_options(preset, "train", kind, dict(args.train)))
        # The vocabulary is the shards' tokenizer's, unless an option says otherwise.
        base["vocab_size"] = TokenShards(args.data, "train").vocab_size
        options = {"label_alignment": "shifted", **merged_options(preset, "model", kind, command_line, base)}
        torch.manual_seed(train.seed)  # the initial weights are part of the run's seed
        model = build_model(config_from_options(options))
    metrics = train_lm(
        model, train, args.data, args.out, resume=args.resume, progress=not args.no_progress, overwrite=args.overwrite
    )
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one process reports
        print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, str)}))
        print(f"checkpoints: {args.out / CHECKPOINTS}")


def add_lm_eval(commands) -> None:
    p = commands.add_parser("eval", help="held-out perplexity of a checkpoint by context length (length extrapolation)")
    _add_lm_test_options(p)
    add_budget_options(p)
    add_solver_flags(p)
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    p.add_argument("--out", type=Path, default=None, help="folder for lm_length.json and lm_length.png")
    p.set_defaults(run=_run_lm_eval)


def _add_lm_test_options(p) -> None:
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--data", type=Path, required=True, help="shard folder")
    p.add_argument("--split", default="test")
    lengths = p.add_mutually_exclusive_group()
    lengths.add_argument("--lengths", type=int_list, default=None, help="comma-separated context lengths (default: the training context)")
    lengths.add_argument("--multiples", type=int_list, default=None, help="context lengths as multiples of the training context, e.g. 1,2,4,8")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--max-tokens", type=positive_int, default=None, help="tokens scored per length (default: the whole split)")
    p.add_argument("--no-progress", action="store_true")


def _lm_test_setup(args) -> tuple:
    """The checkpoint's model, its training context, the held-out shards and the context lengths."""
    from ..data.shards import TokenShards
    from ..models import load_model

    model = load_model(args.checkpoint)
    train_length = training_settings(args.checkpoint).get("sequence_length")
    if args.lengths:
        lengths = args.lengths
    elif train_length is None:
        raise ValueError("the checkpoint does not record its training context; give --lengths")
    else:
        lengths = [train_length * m for m in args.multiples or [1]]
    return model, train_length, TokenShards(args.data, args.split, verify=True), lengths


def _run_lm_eval(args) -> None:
    from ..eval.perplexity import lm_length_record, perplexity_by_length

    model, train_length, shards, lengths = _lm_test_setup(args)
    apply_solver_flags(model, args)
    budget = {"mode": args.mode, "max_iter": args.max_iter, "tol": args.tol}
    rows = perplexity_by_length(model, shards, lengths, args.batch_size, args.max_tokens, not args.no_progress, **budget)
    print(f"{'length':>8}{'loss':>9}{'perplexity':>12}{'tokens':>11}{'not converged':>15}")
    for row in rows:
        print(f"{row['length']:>8}{row['loss']:>9.4f}{row['perplexity']:>12.2f}{row['tokens']:>11,}{missed_cell(row)}")
    if args.out:
        lm_length_record(model, args.checkpoint, rows, args.out, args.mode, train_length)
        print(f"results: {args.out / 'lm_length.json'}, plot: {args.out / 'lm_length.png'}")


def add_lm_budget(commands) -> None:
    p = commands.add_parser("budget", help="test-time compute: perplexity by iteration budget, a curve per context length")
    _add_lm_test_options(p)
    add_sweep_options(p, "lm_budget")
    p.set_defaults(run=_run_lm_budget)


def _run_lm_budget(args) -> None:
    from ..eval.perplexity import perplexity_by_length

    model, _, shards, lengths = _lm_test_setup(args)
    require_implicit(model, "a budget sweep")

    def evaluate(max_iter, tol):
        budget = {"mode": args.mode, "max_iter": max_iter, "tol": tol, "warn": False}
        return perplexity_by_length(model, shards, lengths, args.batch_size, args.max_tokens, **budget)

    run_sweep(args, model, evaluate, "lm_budget", "perplexity", "test-time compute")


def add_lm_convergence(commands) -> None:
    p = commands.add_parser("convergence", help="iterations each token needs in sequential mode, on held-out text")
    _add_lm_test_options(p)
    add_convergence_options(p)
    p.set_defaults(run=_run_lm_convergence, max_tokens=4096)


def _run_lm_convergence(args) -> None:
    from ..data.shards import evaluation_windows
    from ..eval.convergence import convergence_summary, token_iterations

    model, _, shards, lengths = _lm_test_setup(args)
    prepare_convergence(model, args)
    if len(lengths) != 1:
        raise ValueError("convergence statistics take one context length")
    # The split's leading windows, as many as --max-tokens fill.
    windows = next(evaluation_windows(shards, lengths[0], max(1, args.max_tokens // lengths[0])))
    iterations, residuals, max_iter, tol = token_iterations(
        model, windows[:, :-1].numpy(), args.max_iter, args.tol, args.batch_size, not args.no_progress
    )
    summary = convergence_summary(iterations.ravel(), residuals.ravel(), max_iter, tol)
    report_convergence(args, model, summary, "iterations per token (sequential mode)")


def add_lm_demo(commands) -> None:
    p = commands.add_parser("demo", help="explicit vs implicit Mamba2 on Python's standard library, on CPU")
    p.add_argument("--out", type=Path, default=Path("lm_demo_out"), help="output folder (default: lm_demo_out)")
    p.add_argument("--preset", default="lm_demo", help="preset name or JSON file (default: lm_demo)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_lm_demo)


def _run_lm_demo(args) -> None:
    from ..presets import load_preset
    from ..lm_demo import format_lm_table, run_lm_demo

    results = run_lm_demo(load_preset(args.preset), args.out, progress=not args.no_progress)
    print(format_lm_table(results))
    print(f"results: {args.out / 'results.json'}, plot: {args.out / 'perplexity.png'}")


def add_lm_downstream(commands) -> None:
    p = commands.add_parser("downstream", help="zero-shot tasks through lm-evaluation-harness, as the paper's table")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--tasks", default=None, help="comma-separated lm-eval tasks (default: the paper's: lambada_openai,"
                   "hellaswag,piqa,arc_easy,arc_challenge,winogrande,openbookqa)")
    p.add_argument("--include-path", type=Path, default=None, help="folder of further task definitions (YAML)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="read the tasks' documents from this folder instead of the hub (layout: lambada/, hellaswag/, "
                        "piqa/, arc/, winogrande/, openbookqa/ as in the README); without --tasks, the paper's tasks "
                        "whose files are missing are skipped with a warning")
    p.add_argument("--limit", type=positive_float, default=None, help="documents per task (a fraction if below 1): quick checks only")
    p.add_argument("--num-fewshot", type=non_negative_int, default=None, help="examples in each prompt (default: the task's, mostly 0)")
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    add_budget_options(p)
    add_solver_flags(p)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--max-length", type=positive_int, default=None, help="context window in tokens (default: 2048)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or hub name (default: the checkpoint's)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 or float64 (default: as saved)")
    p.add_argument("--out", type=Path, required=True, help="folder for downstream.json and downstream.png")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_lm_downstream)


def _run_lm_downstream(args) -> None:
    try:
        from lm_eval.utils import make_table
    except ImportError:
        raise ValueError("lm downstream needs lm-eval: pip install 'implicitlm[eval]'") from None

    from ..eval.downstream import PAPER_TASKS, downstream_record, paper_table, read_local_sets, run_tasks
    from ..models import load_model

    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()] if args.tasks else list(PAPER_TASKS)
    local_sets, skipped = None, {}
    if args.data_dir is not None:
        local_sets, skipped = read_local_sets(tasks, args.data_dir, skip_missing=not args.tasks)
        for reason in skipped.values():
            print(f"warning: skipped {reason}", file=sys.stderr)
        tasks = list(local_sets)
    model = load_model(args.checkpoint)
    apply_solver_flags(model, args)
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    settings = {"mode": args.mode, "max_iter": args.max_iter, "tol": args.tol, "batch_size": args.batch_size,
                "max_length": args.max_length, "device": args.device, "dtype": args.dtype}
    try:
        results = run_tasks(model, tasks, limit=limit, include_path=args.include_path, num_fewshot=args.num_fewshot,
                            tokenizer=args.tokenizer, progress=not args.no_progress, local_sets=local_sets, **settings)
    except ConnectionError as error:
        if local_sets is not None:
            raise
        raise ConnectionError(f"{error}; without a network, read local copies with --data-dir DIR") from None
    print(make_table(results))
    if any(task in PAPER_TASKS for task in tasks):
        print(paper_table(results)[1])
    data = {"data_dir": str(args.data_dir), "skipped": skipped} if args.data_dir is not None else {"data_dir": None}
    downstream_record(model, args.checkpoint, results, args.out, tasks=tasks, limit=limit, **data, **settings)
    print(f"results: {args.out / 'downstream.json'}, plot: {args.out / 'downstream.png'}")
