"""``implicitlm demo`` and ``implicitlm words ...``: word problems (state tracking)."""

from __future__ import annotations

import json
from pathlib import Path

from .arguments import fraction, int_list, key_value, non_negative_int, options_epilog, positive_int
from .shared import (
    add_budget_options, add_convergence_options, add_solver_flags, add_sweep_options,
    apply_solver_flags, check_resume_or_overwrite, missed_cell, prepare_convergence, progress_bar,
    report_convergence, require_implicit, run_sweep, training_settings,
)


def add_demo(commands) -> None:
    p = commands.add_parser("demo", help="implicit vs explicit Mamba2 on a word problem, accuracy by length")
    p.add_argument("--out", type=Path, default=Path("demo_out"), help="output folder (default: demo_out)")
    p.add_argument("--preset", default="demo", help="preset name or JSON file (default: demo)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_demo)


def _run_demo(args) -> None:
    from ..presets import load_preset
    from ..demo import format_table, run_demo

    results = run_demo(load_preset(args.preset), args.out, progress=not args.no_progress)
    print(format_table(results))
    print(f"results: {args.out / 'results.json'}, plot: {args.out / 'accuracy_by_length.png'}")


def add_words_generate(commands) -> None:
    p = commands.add_parser("generate", help="generate word-problem data")
    p.add_argument("--group", required=True, help="e.g. S5, A5, Z6, S3xZ2, A5xM")
    p.add_argument("--length", type=positive_int, required=True)
    p.add_argument("--count", type=positive_int, required=True)
    p.add_argument("--hard-prob", type=fraction, default=None, help="identity probability of the group part (A5xM)")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--out", type=Path, required=True, help=".csv for CSV; any other suffix: memory-mapped .npy")
    p.add_argument(
        "--targets", choices=("stored", "derived"), default="stored",
        help="derived: store only the inputs (half the size, .npy only); labels are computed when read",
    )
    p.set_defaults(run=_run_words_generate)


def _run_words_generate(args) -> None:
    from ..data.words import generate_words, save_words, write_generated_words

    if args.out.suffix == ".csv":
        if args.targets == "derived":
            raise ValueError(f"{args.out}: --targets derived needs .npy storage; CSV files store their targets")
        inputs, targets = generate_words(args.group, args.length, args.count, args.seed, args.hard_prob)
        save_words(args.out, inputs, targets, {"group": args.group, "seed": args.seed, "hard_prob": args.hard_prob})
    else:
        write_generated_words(
            args.out, args.group, args.length, args.count, args.seed, args.hard_prob, progress=True, targets=args.targets
        )
    print(f"wrote {args.count} words of length {args.length} over {args.group} to {args.out}")


def add_words_train(commands) -> None:
    p = commands.add_parser("train", help="train a model on a word problem")
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoint, metrics.jsonl, tensorboard")
    p.add_argument("--preset", default=None, help="preset name or JSON with 'model' and 'train' sections")
    p.add_argument("--explicit", action="store_true", help="train the explicit model (one pass, no fixed point)")
    p.add_argument("--data", type=Path, default=None, help="training words (.npy or .csv); default: fresh words")
    p.add_argument("--model", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.add_argument("--train", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="training option, repeatable")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out (refused without it)")
    p.add_argument("--no-progress", action="store_true")
    p.epilog = options_epilog("words")
    p.set_defaults(run=_run_words_train)


def _run_words_train(args) -> None:
    from ..presets import load_preset
    from ..data.groups import get_group
    from ..data.words import load_words
    from ..models import load_model
    from ..train.word_setup import word_model, word_train_config
    from ..train.word_trainer import CHECKPOINT, resume_settings, train_words

    if args.resume and (args.preset or args.model or args.explicit):
        raise ValueError("--resume continues the run with its own model; only --train options may change")
    check_resume_or_overwrite(args)
    preset = load_preset(args.preset) if args.preset else {}
    kind = "explicit" if args.explicit else "implicit"
    if args.resume:
        train = resume_settings(args.out, dict(args.train))
    else:
        train = word_train_config(preset, kind, dict(args.train))
    data = load_words(args.data, group=train.group) if args.data else None
    if data is not None and data.group != get_group(train.group).name:
        raise ValueError(f"{args.data}: words over {data.group}, but the training group is {train.group}")
    if args.resume:
        model = load_model(args.out / CHECKPOINT)
    else:
        model = word_model(preset, kind, train, dict(args.model))
    metrics = train_words(
        model, train, args.out, data=data, progress=not args.no_progress, resume=args.resume, overwrite=args.overwrite
    )
    print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, str)}))
    print(f"checkpoint: {args.out / 'checkpoint'}")


def add_words_eval(commands) -> None:
    p = commands.add_parser("eval", help="per-token accuracy of a checkpoint by test length (length extrapolation)")
    _add_word_test_options(p)
    add_budget_options(p)
    add_solver_flags(p)
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    p.add_argument("--out", type=Path, default=None, help="folder for word_length.json and word_length.png")
    p.set_defaults(run=_run_words_eval)


def _add_word_test_options(p) -> None:
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--group", default=None, help="group of generated test words (default: from the checkpoint)")
    lengths = p.add_mutually_exclusive_group()
    lengths.add_argument("--lengths", type=int_list, default=None, help="comma-separated test lengths of generated words")
    lengths.add_argument("--multiples", type=int_list, default=None, help="test lengths as multiples of the training length, e.g. 1,2,4,8")
    p.add_argument("--data", type=Path, action="append", default=[], help="test words file(s) instead")
    p.add_argument("--count", type=positive_int, default=512, help="generated words per length")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--hard-prob", type=fraction, default=None, help="identity probability of the group part (A5xM)")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--no-progress", action="store_true")


def _word_test_sets(args) -> tuple:
    """The checkpoint's model, its group and training length, and the test words: the
    ``--data`` files, or fresh words at each requested length."""
    from ..data.words import load_words
    from ..eval.words import held_out_words
    from ..models import load_model
    model = load_model(args.checkpoint)
    train = training_settings(args.checkpoint)
    group = args.group or train.get("group")
    if not group:
        raise ValueError("--group is needed: the checkpoint does not name its training group")
    _check_group_fits(group, train.get("group"), model.config.vocab_size)
    train_length = train.get("train_length")
    if args.data:
        return model, group, train_length, [(d.inputs, d.targets) for d in (load_words(p, group) for p in args.data)]
    if args.multiples:
        if not train_length:
            raise ValueError("--multiples needs the training length, which the checkpoint does not record; give --lengths")
        lengths = [train_length * m for m in args.multiples]
    elif args.lengths:
        lengths = args.lengths
    else:
        raise ValueError("give --lengths (e.g. 16,32,64), --multiples (e.g. 1,2,4,8) or --data FILE")
    hard_prob = args.hard_prob if args.hard_prob is not None else train.get("hard_prob")
    _require_test_words(model, max(lengths), args.count, args.batch_size)
    return model, group, train_length, [held_out_words(group, n, args.count, args.seed, hard_prob) for n in lengths]


def _require_test_words(model, length: int, count: int, batch_size: int) -> None:
    """The test words (inputs and labels) and one batch's forward at the longest length."""
    from ..core.memory import activation_bytes, require

    config = model.config
    needed = 2 * 8 * count * length + activation_bytes(min(batch_size, count), length, config.hidden_size, config.num_hidden_layers)
    require(f"{count} test words of length {length:,}", needed)


def _check_group_fits(group: str, trained: str | None, vocab_size: int) -> None:
    """A model answers in the elements of the group it was trained on: another group's words
    would be read as those elements and scored against meaningless labels."""
    from ..data.groups import get_group

    algebra = get_group(group)
    if trained and algebra.name != get_group(trained).name:
        raise ValueError(f"--group {group}: the checkpoint was trained on {trained}; evaluate it on {trained}")
    if algebra.order != vocab_size:
        raise ValueError(f"--group {group}: {algebra.order} elements, but the model reads {vocab_size} tokens")


def _run_words_eval(args) -> None:
    from ..eval.words import word_accuracy, word_length_record

    model, group, train_length, test_sets = _word_test_sets(args)
    apply_solver_flags(model, args)
    budget = {"mode": args.mode, "max_iter": args.max_iter, "tol": args.tol, "batch_size": args.batch_size}
    rows = [word_accuracy(model, inputs, targets, **budget) for inputs, targets in progress_bar(test_sets, args)]
    # Token 1 is left out of "all": its label is its input.
    print(f"{'length':>8}{'last10':>9}{'all':>9}{'fp iters':>10}{'not converged':>15}")
    for row in rows:
        iters = f"{row['fp_iterations_mean']:>10.1f}" if "fp_iterations_mean" in row else f"{'-':>10}"
        print(f"{row['length']:>8}{row['accuracy_last10']:>9.1%}{row['accuracy']:>9.1%}{iters}{missed_cell(row)}")
    if args.out:
        word_length_record(model, args.checkpoint, rows, args.out, group, args.mode, train_length)
        print(f"results: {args.out / 'word_length.json'}, plot: {args.out / 'word_length.png'}")


def add_words_budget(commands) -> None:
    p = commands.add_parser("budget", help="test-time compute: accuracy by iteration budget, a curve per test length")
    _add_word_test_options(p)
    add_sweep_options(p, "word_budget")
    p.set_defaults(run=_run_words_budget)


def _run_words_budget(args) -> None:
    from ..eval.words import word_accuracy

    model, group, _, test_sets = _word_test_sets(args)
    require_implicit(model, "a budget sweep")

    def evaluate(max_iter, tol):
        budget = {"mode": args.mode, "max_iter": max_iter, "tol": tol, "batch_size": args.batch_size, "warn": False}
        return [word_accuracy(model, inputs, targets, **budget) for inputs, targets in test_sets]

    title = f"{group} word problem: test-time compute"
    run_sweep(args, model, evaluate, "word_budget", "accuracy_last10", title, group=group)


def add_words_convergence(commands) -> None:
    p = commands.add_parser("convergence", help="iterations each token needs in sequential mode; hard vs easy tokens")
    _add_word_test_options(p)
    add_convergence_options(p)
    p.set_defaults(run=_run_words_convergence, count=64)


def _run_words_convergence(args) -> None:
    import numpy as np

    from ..data.groups import get_group
    from ..data.words import hard_token_mask
    from ..eval.convergence import convergence_summary, token_iterations

    model, group, _, test_sets = _word_test_sets(args)
    prepare_convergence(model, args)
    iterations, residuals, hard = [], [], []
    for inputs, _ in test_sets:
        its, res, max_iter, tol = token_iterations(model, inputs, args.max_iter, args.tol, args.batch_size, not args.no_progress)
        iterations.append(its.ravel()), residuals.append(res.ravel()), hard.append(hard_token_mask(group, inputs).ravel())
    # Hard vs easy only where the group is a product, whose first factor the mask reads.
    product = len(get_group(group).factor_orders) > 1
    summary = convergence_summary(
        np.concatenate(iterations), np.concatenate(residuals), max_iter, tol, np.concatenate(hard) if product else None
    )
    report_convergence(args, model, summary, f"{group}: iterations per token (sequential mode)", group=group)
