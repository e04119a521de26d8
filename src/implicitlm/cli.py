"""The ``implicitlm`` command line."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    _quiet_libraries()
    from .core.errors import NumericalFault
    from .train.guard import TrainingInterrupted

    out = getattr(args, "out", None)
    new_out = out is not None and not out.exists()
    try:
        args.run(args)
    except USER_ERRORS as error:
        # Bad input is reported in one line, never as a traceback, and leaves no partial output.
        if new_out:
            _remove_partial_output(out)
        return _fail(error, 2)
    except (NumericalFault, OSError) as error:
        # Valid input, but the run cannot go on: NaN/Inf, a fatal non-convergence, a full disk.
        return _fail(error, 1)
    except TrainingInterrupted as stopped:
        hint = "; continue with --resume" if hasattr(args, "resume") else ""
        print(f"implicitlm: {stopped}{hint}", file=sys.stderr)
        return stopped.exit_code
    except KeyboardInterrupt:
        print("implicitlm: interrupted", file=sys.stderr)
        return 130
    return 0


def _remove_partial_output(out: Path) -> None:
    """Remove the --out folder a command created before it met bad input, unless it already
    holds a checkpoint: finished training steps are work, not partial output."""
    if out.is_dir() and not any(out.glob("checkpoint*")):
        shutil.rmtree(out, ignore_errors=True)


def _fail(error: BaseException, code: int) -> int:
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        message = f"{error.filename}: {error.strerror}"  # not "[Errno 17] File exists: 'x'"
    else:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
    print(f"implicitlm: error: {message}", file=sys.stderr)
    return code


def _quiet_libraries() -> None:
    # Saving and loading a checkpoint is instant; the libraries' own progress bars are noise.
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    # Without a network the hub logs each of its retries as a warning before the request fails;
    # the failure itself reaches the user as our one error line.
    hub_logging.set_verbosity_error()


class _Parser(argparse.ArgumentParser):
    """argparse reporting a bad option in one line, as every other input error is (its
    default prints the whole usage first). Subcommands inherit the class."""

    # Set on a command taking --model / --train: returns the sections that list their keys
    # (built when --help asks, so that other commands do not import the models).
    option_sections: Callable[[], str] | None = None

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        text = super().format_help()
        return text if self.option_sections is None else f"{text}\n{self.option_sections()}\n"

    def _get_values(self, action, arg_strings):
        # Before Python 3.12, argparse drops a value that is exactly "--" ("--hard-prob=--") as if
        # it ended the options, and hands the option an empty list instead of refusing it.
        if arg_strings == ["--"] and action.nargs is None:
            raise argparse.ArgumentError(action, "expected a value, got '--'")
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="implicitlm", description="Implicit language models.")
    commands = parser.add_subparsers(title="commands")
    _add_demo(commands)
    words = commands.add_parser("words", help="word problems (state tracking)").add_subparsers(title="commands")
    _add_words_generate(words)
    _add_words_train(words)
    _add_words_eval(words)
    _add_words_budget(words)
    _add_words_convergence(words)
    models = commands.add_parser("models", help="the paper's model presets; import from Hugging Face")
    models = models.add_subparsers(title="commands")
    _add_models_list(models)
    _add_models_show(models)
    _add_models_import(models)
    tokenizer = commands.add_parser("tokenizer", help="tokenizers for language modelling")
    _add_tokenizer_train(tokenizer.add_subparsers(title="commands"))
    corpus = commands.add_parser("corpus", help="language-model corpora as token shards")
    _add_corpus_build(corpus.add_subparsers(title="commands"))
    _add_catbabi(commands)
    _add_train(commands)
    lm = commands.add_parser("lm", help="language models: perplexity, the CPU demo").add_subparsers(title="commands")
    _add_lm_eval(lm)
    _add_lm_budget(lm)
    _add_lm_convergence(lm)
    _add_lm_demo(lm)
    _add_lm_downstream(lm)
    _add_report(commands)
    _add_jacobian(commands)
    return parser


def _add_demo(commands) -> None:
    p = commands.add_parser("demo", help="implicit vs explicit Mamba2 on a word problem, accuracy by length")
    p.add_argument("--out", type=Path, default=Path("demo_out"), help="output folder (default: demo_out)")
    p.add_argument("--preset", default="demo", help="preset name or JSON file (default: demo)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_demo)


def _run_demo(args) -> None:
    from .configs import load_preset
    from .demo import format_table, run_demo

    results = run_demo(load_preset(args.preset), args.out, progress=not args.no_progress)
    print(format_table(results))
    print(f"results: {args.out / 'results.json'}, plot: {args.out / 'accuracy_by_length.png'}")


def _add_words_generate(commands) -> None:
    p = commands.add_parser("generate", help="generate word-problem data")
    p.add_argument("--group", required=True, help="e.g. S5, A5, Z6, S3xZ2, A5xM")
    p.add_argument("--length", type=_positive_int, required=True)
    p.add_argument("--count", type=_positive_int, required=True)
    p.add_argument("--hard-prob", type=_fraction, default=None, help="identity probability of the group part (A5xM)")
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.add_argument("--out", type=Path, required=True, help=".csv for CSV; any other suffix: memory-mapped .npy")
    p.add_argument(
        "--targets", choices=("stored", "derived"), default="stored",
        help="derived: store only the inputs (half the size, .npy only); labels are computed when read",
    )
    p.set_defaults(run=_run_words_generate)


def _run_words_generate(args) -> None:
    from .data.words import generate_words, save_words, write_generated_words

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


def _add_words_train(commands) -> None:
    p = commands.add_parser("train", help="train a model on a word problem")
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoint, metrics.jsonl, tensorboard")
    p.add_argument("--preset", default=None, help="preset name or JSON with 'model' and 'train' sections")
    p.add_argument("--explicit", action="store_true", help="train the explicit model (one pass, no fixed point)")
    p.add_argument("--data", type=Path, default=None, help="training words (.npy or .csv); default: fresh words")
    p.add_argument("--model", type=_key_value, action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.add_argument("--train", type=_key_value, action="append", default=[], metavar="KEY=VALUE", help="training option, repeatable")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out (refused without it)")
    p.add_argument("--no-progress", action="store_true")
    p.option_sections = lambda: _option_sections("words")
    p.set_defaults(run=_run_words_train)


def _run_words_train(args) -> None:
    from .configs import load_preset
    from .data.groups import get_group
    from .data.words import load_words
    from .models import load_model
    from .train.word_setup import word_model, word_train_config
    from .train.word_trainer import CHECKPOINT, resume_settings, train_words

    if args.resume and (args.preset or args.model or args.explicit):
        raise ValueError("--resume continues the run with its own model; only --train options may change")
    _check_resume_or_overwrite(args)
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


def _add_words_eval(commands) -> None:
    p = commands.add_parser("eval", help="per-token accuracy of a checkpoint by test length (length extrapolation)")
    _add_word_test_options(p)
    _add_budget_options(p)
    _add_solver_flags(p)
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    p.add_argument("--out", type=Path, default=None, help="folder for word_length.json and word_length.png")
    p.set_defaults(run=_run_words_eval)


def _add_word_test_options(p) -> None:
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--group", default=None, help="group of generated test words (default: from the checkpoint)")
    lengths = p.add_mutually_exclusive_group()
    lengths.add_argument("--lengths", type=_int_list, default=None, help="comma-separated test lengths of generated words")
    lengths.add_argument("--multiples", type=_int_list, default=None, help="test lengths as multiples of the training length, e.g. 1,2,4,8")
    p.add_argument("--data", type=Path, action="append", default=[], help="test words file(s) instead")
    p.add_argument("--count", type=_positive_int, default=512, help="generated words per length")
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.add_argument("--hard-prob", type=_fraction, default=None, help="identity probability of the group part (A5xM)")
    p.add_argument("--batch-size", type=_positive_int, default=256)
    p.add_argument("--no-progress", action="store_true")


def _add_budget_options(p) -> None:
    p.add_argument("--max-iter", type=_positive_int, default=None, help="fixed-point budget (default: the model's eval budget)")
    p.add_argument("--tol", type=_positive_float, default=None, help="fixed-point tolerance (default: the model's)")


def _add_solver_flags(p) -> None:
    """How an evaluation's solves run, besides their budget: ``_apply_solver_flags`` sets them."""
    from .deq.options import SOLVERS

    p.add_argument("--fail-on-nonconvergence", action="store_true",
                   help="stop with exit code 1 if any sample or token misses the tolerance (default: count them)")
    p.add_argument("--chunk-length", type=_non_negative_int, default=None,
                   help="simultaneous mode solves in chunks of this many tokens, carrying the state "
                        "(0: the whole sequence; default: the model's eval_chunk_length, its training length)")
    p.add_argument("--solver", default=None,
                   help=f"fixed-point solver of every solve in this run: {', '.join(SOLVERS)} "
                        "(default: the model's, per mode)")


def _apply_solver_flags(model, args) -> None:
    if args.fail_on_nonconvergence:
        model.set_fixed_point_options(eval_nonconvergence="error")
    if args.chunk_length is not None:
        model.set_fixed_point_options(eval_chunk_length=args.chunk_length)
    if args.solver is not None:
        model.use_solver(args.solver)


def _word_test_sets(args) -> tuple:
    """The checkpoint's model, its group and training length, and the test words: the
    ``--data`` files, or fresh words at each requested length."""
    from .data.words import load_words
    from .eval.words import held_out_words
    from .models import load_model
    model = load_model(args.checkpoint)
    train = _training_settings(args.checkpoint)
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
    from .core.memory import activation_bytes, require

    config = model.config
    needed = 2 * 8 * count * length + activation_bytes(min(batch_size, count), length, config.hidden_size, config.num_hidden_layers)
    require(f"{count} test words of length {length:,}", needed)


def _check_group_fits(group: str, trained: str | None, vocab_size: int) -> None:
    """A model answers in the elements of the group it was trained on: another group's words
    would be read as those elements and scored against meaningless labels."""
    from .data.groups import get_group

    algebra = get_group(group)
    if trained and algebra.name != get_group(trained).name:
        raise ValueError(f"--group {group}: the checkpoint was trained on {trained}; evaluate it on {trained}")
    if algebra.order != vocab_size:
        raise ValueError(f"--group {group}: {algebra.order} elements, but the model reads {vocab_size} tokens")


def _run_words_eval(args) -> None:
    from .eval.words import word_accuracy, word_length_record

    model, group, train_length, test_sets = _word_test_sets(args)
    _apply_solver_flags(model, args)
    budget = {"mode": args.mode, "max_iter": args.max_iter, "tol": args.tol, "batch_size": args.batch_size}
    rows = [word_accuracy(model, inputs, targets, **budget) for inputs, targets in _progress(test_sets, args)]
    # Token 1 is left out of "all": its label is its input.
    print(f"{'length':>8}{'last10':>9}{'all':>9}{'fp iters':>10}{'not converged':>15}")
    for row in rows:
        iters = f"{row['fp_iterations_mean']:>10.1f}" if "fp_iterations_mean" in row else f"{'-':>10}"
        print(f"{row['length']:>8}{row['accuracy_last10']:>9.1%}{row['accuracy']:>9.1%}{iters}{_missed_cell(row)}")
    if args.out:
        word_length_record(model, args.checkpoint, rows, args.out, group, args.mode, train_length)
        print(f"results: {args.out / 'word_length.json'}, plot: {args.out / 'word_length.png'}")


def _add_words_budget(commands) -> None:
    p = commands.add_parser("budget", help="test-time compute: accuracy by iteration budget, a curve per test length")
    _add_word_test_options(p)
    _add_sweep_options(p, "word_budget")
    p.set_defaults(run=_run_words_budget)


def _add_sweep_options(p, experiment: str) -> None:
    p.add_argument("--budgets", type=_int_list, default=[1, 2, 4, 8, 16, 32, 64], help="comma-separated max_iter values")
    p.add_argument("--tols", type=_float_list, default=None, help="comma-separated tolerances (default: the model's)")
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    _add_solver_flags(p)
    p.add_argument("--out", type=Path, required=True, help=f"folder for {experiment}.json and {experiment}.png")


def _run_sweep(args, model, evaluate, experiment: str, quality: str, title: str, **details) -> None:
    """The budget sweep of a ``budget`` command: table, record and figure."""
    from .eval.budget import budget_record, budget_sweep

    _apply_solver_flags(model, args)
    rows = budget_sweep(evaluate, args.budgets, args.tols or [None], progress=not args.no_progress)
    _print_budget_table(rows, quality)
    title = f"{title} ({args.mode} mode)"
    budget_record(experiment, model, args.checkpoint, rows, quality, args.out, title, mode=args.mode, **details)
    print(f"results: {args.out / f'{experiment}.json'}, plot: {args.out / f'{experiment}.png'}")


def _run_words_budget(args) -> None:
    from .eval.words import word_accuracy

    model, group, _, test_sets = _word_test_sets(args)
    _require_implicit(model, "a budget sweep")

    def evaluate(max_iter, tol):
        budget = {"mode": args.mode, "max_iter": max_iter, "tol": tol, "batch_size": args.batch_size, "warn": False}
        return [word_accuracy(model, inputs, targets, **budget) for inputs, targets in test_sets]

    title = f"{group} word problem: test-time compute"
    _run_sweep(args, model, evaluate, "word_budget", "accuracy_last10", title, group=group)


def _add_words_convergence(commands) -> None:
    p = commands.add_parser("convergence", help="iterations each token needs in sequential mode; hard vs easy tokens")
    _add_word_test_options(p)
    _add_convergence_options(p)
    p.set_defaults(run=_run_words_convergence, count=64)


def _run_words_convergence(args) -> None:
    import numpy as np

    from .data.groups import get_group
    from .data.words import hard_token_mask
    from .eval.convergence import convergence_summary, token_iterations

    model, group, _, test_sets = _word_test_sets(args)
    _prepare_convergence(model, args)
    iterations, residuals, hard = [], [], []
    for inputs, _ in test_sets:
        its, res, max_iter, tol = token_iterations(model, inputs, args.max_iter, args.tol, args.batch_size, not args.no_progress)
        iterations.append(its.ravel()), residuals.append(res.ravel()), hard.append(hard_token_mask(group, inputs).ravel())
    # Hard vs easy only where the group is a product, whose first factor the mask reads.
    product = len(get_group(group).factor_orders) > 1
    summary = convergence_summary(
        np.concatenate(iterations), np.concatenate(residuals), max_iter, tol, np.concatenate(hard) if product else None
    )
    _report_convergence(args, model, summary, f"{group}: iterations per token (sequential mode)", group=group)


def _add_convergence_options(p) -> None:
    _add_budget_options(p)
    _add_solver_flags(p)
    p.add_argument("--out", type=Path, required=True, help="folder for convergence.json and convergence.png")


def _prepare_convergence(model, args) -> None:
    """An implicit model, running the solver ``--solver`` names (else its own)."""
    _require_implicit(model, "convergence statistics")
    _apply_solver_flags(model, args)


def _report_convergence(args, model, summary: dict[str, Any], title: str, **details) -> None:
    from .eval.convergence import convergence_record

    _print_convergence(summary)
    convergence_record(model, args.checkpoint, summary, args.out, title, **details)
    print(f"results: {args.out / 'convergence.json'}, plot: {args.out / 'convergence.png'}")


def _add_models_list(commands) -> None:
    p = commands.add_parser("list", help="every model preset with its size and parameter count")
    p.set_defaults(run=_run_models_list)


def _run_models_list(args) -> None:
    from .models.presets import model_preset_names, preset_summary

    print(f"{'name':<26}{'arch':<8}{'layers':>7}{'d_model':>8}  {'variant':<14}{'eval iters':>10}{'params (M)':>12}")
    for row in map(preset_summary, model_preset_names()):
        eval_iterations = "-" if row["eval_iterations"] is None else row["eval_iterations"]
        print(
            f"{row['name']:<26}{row['architecture']:<8}{row['layers']:>7}{row['d_model']:>8}  {row['variant']:<14}"
            f"{eval_iterations:>10}{row['parameters'] / 1e6:>12.1f}"
        )


def _add_models_show(commands) -> None:
    p = commands.add_parser("show", help="a preset's model options as JSON")
    p.add_argument("name", help="preset name (see: implicitlm models list)")
    p.set_defaults(run=_run_models_show)


def _run_models_show(args) -> None:
    from .models.presets import model_preset

    print(json.dumps(model_preset(args.name), indent=2))


def _add_models_import(commands) -> None:
    p = commands.add_parser("import", help="convert a transformers Mamba2 / Llama / Mamba (Mamba1) checkpoint (safetensors)")
    p.add_argument("source", type=Path, help="checkpoint directory (config.json + safetensors weights)")
    p.add_argument("--out", type=Path, required=True, help="folder for the converted model")
    p.add_argument("--implicit", action="store_true", help="an implicit model initialised from the explicit weights")
    p.add_argument("--model", type=_key_value, action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.option_sections = lambda: _option_sections(None)
    p.set_defaults(run=_run_models_import)


def _run_models_import(args) -> None:
    from .models.convert import from_hf
    from .models.loading import write_weights_digest

    model = from_hf(args.source, implicit=args.implicit, **dict(args.model))
    model.save_pretrained(args.out)
    write_weights_digest(args.out)
    kind = "implicit" if model.config.implicit else "explicit"
    print(f"saved the {kind} model ({model.num_parameters() / 1e6:.1f}M parameters) to {args.out}")
    # The source's tokenizer goes with it, so that the folder alone serves generate() and lm-eval.
    if (Path(args.source) / "tokenizer_config.json").is_file():
        from .data.tokenizer import load_tokenizer, save_tokenizer

        save_tokenizer(load_tokenizer(args.source), Path(args.out))
        print(f"copied the tokenizer from {args.source}")


def _add_tokenizer_train(commands) -> None:
    p = commands.add_parser("train", help="train a byte-level BPE tokenizer on local text (offline)")
    p.add_argument("sources", nargs="+", help="text / .jsonl / .parquet files or folders")
    p.add_argument("--out", type=Path, required=True, help="tokenizer folder (Hugging Face format)")
    p.add_argument("--vocab-size", type=_positive_int, default=32768)
    p.add_argument("--text-field", default="text", help="field holding the text in JSONL / Parquet")
    p.add_argument("--pattern", default="*", help="file name pattern inside folders (e.g. '*.py')")
    p.set_defaults(run=_run_tokenizer_train)


def _run_tokenizer_train(args) -> None:
    from .data.corpus import read_documents
    from .data.tokenizer import train_tokenizer

    documents = read_documents(args.sources, text_field=args.text_field, pattern=args.pattern)
    tokenizer = train_tokenizer(documents, args.vocab_size, args.out)
    print(f"saved a tokenizer of {len(tokenizer)} tokens to {args.out}")


def _add_corpus_build(commands) -> None:
    p = commands.add_parser("build", help="tokenize documents into packed, memory-mapped token shards")
    p.add_argument("sources", nargs="+", help="text / .jsonl / .parquet files or folders, or a hub dataset name")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder or hub name (e.g. EleutherAI/gpt-neox-20b)")
    p.add_argument("--out", type=Path, required=True, help="shard folder")
    held_out = p.add_mutually_exclusive_group()
    held_out.add_argument("--test-fraction", type=_fraction, default=0.001, help="share of documents held out (default 0.1%%)")
    held_out.add_argument(
        "--test-sources", nargs="+", metavar="SOURCE",
        help="the test split's own documents (e.g. a validation file); all of the sources are then trained on",
    )
    p.add_argument("--shard-tokens", type=_positive_int, default=2**24, help="tokens per shard file")
    p.add_argument("--workers", type=_positive_int, default=1, help="tokenizer processes")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the train/test split")
    p.add_argument("--text-field", default="text", help="field holding the text in JSONL / Parquet / datasets")
    p.add_argument("--pattern", default="*", help="file name pattern inside folders (e.g. '*.txt')")
    p.add_argument("--split", default="train", help="split of a hub dataset")
    p.add_argument("--resume", action="store_true", help="continue an interrupted build")
    p.add_argument("--overwrite", action="store_true", help="replace a finished build")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_corpus_build)


def _run_corpus_build(args) -> None:
    from .data.corpus import read_documents
    from .data.shards import TokenShards, write_shards
    from .data.tokenizer import load_tokenizer

    def documents(sources):
        return read_documents(sources, text_field=args.text_field, split=args.split, pattern=args.pattern)

    write_shards(
        documents(args.sources), load_tokenizer(args.tokenizer), args.out, shard_tokens=args.shard_tokens,
        test_fraction=args.test_fraction, seed=args.seed, workers=args.workers, progress=not args.no_progress,
        resume=args.resume, overwrite=args.overwrite,
        test_documents=documents(args.test_sources) if args.test_sources else None,
    )
    train, test = TokenShards(args.out, "train"), TokenShards(args.out, "test")
    print(f"wrote {len(train):,} training and {len(test):,} held-out tokens to {args.out}")


def _add_train(commands) -> None:
    p = commands.add_parser("train", help="train a language model on token shards (torchrun for several processes)")
    p.add_argument("--data", type=Path, required=True, help="shard folder (implicitlm corpus build)")
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoints, metrics.jsonl, tensorboard")
    p.add_argument("--model-preset", default=None, help="model preset (implicitlm models list) or JSON file")
    p.add_argument(
        "--config", default=None,
        help="training preset name or JSON with 'model' and 'train' sections (and 'explicit_model' / 'implicit_model')",
    )
    p.add_argument("--model", type=_key_value, action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.add_argument("--train", type=_key_value, action="append", default=[], metavar="KEY=VALUE", help="training option, repeatable")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out (refused without it)")
    p.add_argument("--no-progress", action="store_true")
    p.option_sections = lambda: _option_sections("lm")
    p.set_defaults(run=_run_train)


def _check_resume_or_overwrite(args) -> None:
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it: pass one")


def _run_train(args) -> None:
    import torch

    from .configs import load_preset
    from .data.shards import TokenShards
    from .models import build_model, config_from_options, load_model
    from .models.presets import model_preset
    from .train.checkpoint import latest_checkpoint
    from .train.lm_trainer import CHECKPOINTS, LMTrainConfig, resume_config, train_lm

    _check_resume_or_overwrite(args)
    preset = load_preset(args.config) if args.config else {}
    if args.resume:
        # The run's own settings, with any given on the command line on top.
        train = resume_config(args.out, dict(args.train))
        model = load_model(latest_checkpoint(args.out / CHECKPOINTS))
    else:
        train = LMTrainConfig.from_dict({**preset.get("train", {}), **dict(args.train)})
        options = {}
        if args.model_preset:
            from_file = args.model_preset.endswith(".json")
            options.update(load_preset(args.model_preset) if from_file else model_preset(args.model_preset))
        # The vocabulary is the shards' tokenizer's, unless an option says otherwise.
        options["vocab_size"] = TokenShards(args.data, "train").vocab_size
        # A preset's "explicit_model" / "implicit_model" section holds the widths that give both
        # kinds the same number of parameters; the command line still has the last word.
        shared, command_line = preset.get("model", {}), dict(args.model)
        kind = "implicit" if {**options, **shared, **command_line}.get("implicit", True) else "explicit"
        options.update({**shared, **preset.get(f"{kind}_model", {}), **command_line})
        options.setdefault("label_alignment", "shifted")
        torch.manual_seed(train.seed)  # the initial weights are part of the run's seed
        model = build_model(config_from_options(options))
    metrics = train_lm(
        model, train, args.data, args.out, resume=args.resume, progress=not args.no_progress, overwrite=args.overwrite
    )
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one process reports
        print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, str)}))
        print(f"checkpoints: {args.out / CHECKPOINTS}")


def _add_lm_eval(commands) -> None:
    p = commands.add_parser("eval", help="held-out perplexity of a checkpoint by context length (length extrapolation)")
    _add_lm_test_options(p)
    _add_budget_options(p)
    _add_solver_flags(p)
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    p.add_argument("--out", type=Path, default=None, help="folder for lm_length.json and lm_length.png")
    p.set_defaults(run=_run_lm_eval)


def _add_lm_test_options(p) -> None:
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--data", type=Path, required=True, help="shard folder")
    p.add_argument("--split", default="test")
    lengths = p.add_mutually_exclusive_group()
    lengths.add_argument("--lengths", type=_int_list, default=None, help="comma-separated context lengths (default: the training context)")
    lengths.add_argument("--multiples", type=_int_list, default=None, help="context lengths as multiples of the training context, e.g. 1,2,4,8")
    p.add_argument("--batch-size", type=_positive_int, default=8)
    p.add_argument("--max-tokens", type=_positive_int, default=None, help="tokens scored per length (default: the whole split)")
    p.add_argument("--no-progress", action="store_true")


def _lm_test_setup(args) -> tuple:
    """The checkpoint's model, its training context, the held-out shards and the context lengths."""
    from .data.shards import TokenShards
    from .models import load_model

    model = load_model(args.checkpoint)
    train_length = _training_settings(args.checkpoint).get("sequence_length")
    if args.lengths:
        lengths = args.lengths
    elif train_length is None:
        raise ValueError("the checkpoint does not record its training context; give --lengths")
    else:
        lengths = [train_length * m for m in args.multiples or [1]]
    return model, train_length, TokenShards(args.data, args.split, verify=True), lengths


def _run_lm_eval(args) -> None:
    from .eval.perplexity import lm_length_record, perplexity_by_length

    model, train_length, shards, lengths = _lm_test_setup(args)
    _apply_solver_flags(model, args)
    budget = {"mode": args.mode, "max_iter": args.max_iter, "tol": args.tol}
    rows = perplexity_by_length(model, shards, lengths, args.batch_size, args.max_tokens, not args.no_progress, **budget)
    print(f"{'length':>8}{'loss':>9}{'perplexity':>12}{'tokens':>11}{'not converged':>15}")
    for row in rows:
        print(f"{row['length']:>8}{row['loss']:>9.4f}{row['perplexity']:>12.2f}{row['tokens']:>11,}{_missed_cell(row)}")
    if args.out:
        lm_length_record(model, args.checkpoint, rows, args.out, args.mode, train_length)
        print(f"results: {args.out / 'lm_length.json'}, plot: {args.out / 'lm_length.png'}")


def _add_lm_budget(commands) -> None:
    p = commands.add_parser("budget", help="test-time compute: perplexity by iteration budget, a curve per context length")
    _add_lm_test_options(p)
    _add_sweep_options(p, "lm_budget")
    p.set_defaults(run=_run_lm_budget)


def _run_lm_budget(args) -> None:
    from .eval.perplexity import perplexity_by_length

    model, _, shards, lengths = _lm_test_setup(args)
    _require_implicit(model, "a budget sweep")

    def evaluate(max_iter, tol):
        budget = {"mode": args.mode, "max_iter": max_iter, "tol": tol, "warn": False}
        return perplexity_by_length(model, shards, lengths, args.batch_size, args.max_tokens, **budget)

    _run_sweep(args, model, evaluate, "lm_budget", "perplexity", "test-time compute")


def _add_lm_convergence(commands) -> None:
    p = commands.add_parser("convergence", help="iterations each token needs in sequential mode, on held-out text")
    _add_lm_test_options(p)
    _add_convergence_options(p)
    p.set_defaults(run=_run_lm_convergence, max_tokens=4096)


def _run_lm_convergence(args) -> None:
    from .data.shards import evaluation_windows
    from .eval.convergence import convergence_summary, token_iterations

    model, _, shards, lengths = _lm_test_setup(args)
    _prepare_convergence(model, args)
    if len(lengths) != 1:
        raise ValueError("convergence statistics take one context length")
    # The split's leading windows, as many as --max-tokens fill.
    windows = next(evaluation_windows(shards, lengths[0], max(1, args.max_tokens // lengths[0])))
    iterations, residuals, max_iter, tol = token_iterations(
        model, windows[:, :-1].numpy(), args.max_iter, args.tol, args.batch_size, not args.no_progress
    )
    summary = convergence_summary(iterations.ravel(), residuals.ravel(), max_iter, tol)
    _report_convergence(args, model, summary, "iterations per token (sequential mode)")


def _add_report(commands) -> None:
    p = commands.add_parser("report", help="gather the results of several runs into one Markdown table and figures")
    p.add_argument("runs", nargs="+", type=Path, help="run folders (searched for result JSON files) or result files")
    p.add_argument("--out", type=Path, default=Path("report"), help="folder for report.md and figures (default: report)")
    p.set_defaults(run=_run_report)


def _run_report(args) -> None:
    from .eval.report import write_report

    report, figures = write_report(args.runs, args.out)
    print(report.read_text())
    print(f"report: {report}, figures: {', '.join(str(f) for f in figures)}")


def _add_lm_demo(commands) -> None:
    p = commands.add_parser("demo", help="explicit vs implicit Mamba2 on Python's standard library, on CPU")
    p.add_argument("--out", type=Path, default=Path("lm_demo_out"), help="output folder (default: lm_demo_out)")
    p.add_argument("--preset", default="lm_demo", help="preset name or JSON file (default: lm_demo)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_lm_demo)


def _run_lm_demo(args) -> None:
    from .configs import load_preset
    from .lm_demo import format_lm_table, run_lm_demo

    results = run_lm_demo(load_preset(args.preset), args.out, progress=not args.no_progress)
    print(format_lm_table(results))
    print(f"results: {args.out / 'results.json'}, plot: {args.out / 'perplexity.png'}")


def _add_catbabi(commands) -> None:
    catbabi = commands.add_parser("catbabi", help="catbAbI: the 20 bAbI tasks as one language-modelling stream")
    catbabi = catbabi.add_subparsers(title="commands")
    p = catbabi.add_parser("build", help="bAbI v1.2 task files (en-valid or en-valid-10k) -> a folder for `train --data`")
    p.add_argument("babi_dir", type=Path, help="folder of qaN_train.txt, qaN_valid.txt, qaN_test.txt")
    p.add_argument("--out", type=Path, required=True, help="catbAbI folder: token shards, tokenizer, answer positions")
    p.add_argument("--tasks", type=_int_list, default=None, help="comma-separated task ids (default: all 20)")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the story order")
    p.add_argument("--overwrite", action="store_true", help="replace a built folder")
    p.set_defaults(run=_run_catbabi_build)
    p = catbabi.add_parser("sample", help="write the tiny bAbI-format sample shipped for tests (tasks 1, 6, 8, 15, 19)")
    p.add_argument("--out", type=Path, required=True, help="folder for the sample's task files")
    p.set_defaults(run=_run_catbabi_sample)
    p = catbabi.add_parser("eval", help="answer accuracy of a checkpoint, overall and per task")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--data", type=Path, required=True, help="catbAbI folder (implicitlm catbabi build)")
    p.add_argument("--split", choices=["train", "valid", "test"], default="test", help="bAbI split (default: test)")
    p.add_argument("--sequence-length", type=_positive_int, default=256, help="window length")
    p.add_argument("--stride", type=_positive_int, default=None, help="window step; every answer sees at least "
                   "sequence-length - stride tokens before it (default: half the window)")
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    _add_budget_options(p)
    _add_solver_flags(p)
    p.add_argument("--batch-size", type=_positive_int, default=8)
    p.add_argument("--out", type=Path, required=True, help="folder for catbabi.json and catbabi.png")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_catbabi_eval)


def _run_catbabi_build(args) -> None:
    from .data.catbabi import build_catbabi

    tasks = args.tasks
    summary = build_catbabi(args.babi_dir, args.out, tasks=tasks, seed=args.seed, overwrite=args.overwrite)
    for split, counts in summary["splits"].items():
        print(f"{split}: {counts['stories']:,} stories, {counts['answers']:,} answers")
    print(f"valid stories: {summary['valid']}")
    print(f"vocabulary: {summary['vocab_size']} tokens; wrote {args.out}")


def _run_catbabi_sample(args) -> None:
    from .data.babi_sample import write_babi_sample

    write_babi_sample(args.out)
    print(f"wrote the bAbI-format sample to {args.out} (build it with --tasks 1,6,8,15,19)")


def _run_catbabi_eval(args) -> None:
    from .eval.catbabi import answer_accuracy, format_task_table, write_catbabi_results
    from .models import load_model

    model = load_model(args.checkpoint)
    _apply_solver_flags(model, args)
    settings = {"split": args.split, "sequence_length": args.sequence_length, "mode": args.mode,
                "max_iter": args.max_iter, "tol": args.tol}
    result = answer_accuracy(model, args.data, **settings, stride=args.stride, batch_size=args.batch_size,
                             progress=not args.no_progress)
    print(format_task_table(result))
    write_catbabi_results(args.out, args.checkpoint, model, result, data=str(args.data), **settings)
    print(f"results: {args.out / 'catbabi.json'}, plot: {args.out / 'catbabi.png'}")


def _add_lm_downstream(commands) -> None:
    p = commands.add_parser("downstream", help="zero-shot tasks through lm-evaluation-harness, as the paper's table")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--tasks", default=None, help="comma-separated lm-eval tasks (default: the paper's: lambada_openai,"
                   "hellaswag,piqa,arc_easy,arc_challenge,winogrande,openbookqa)")
    p.add_argument("--include-path", type=Path, default=None, help="folder of further task definitions (YAML)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="read the tasks' documents from this folder instead of the hub (layout: lambada/, hellaswag/, "
                        "piqa/, arc/, winogrande/, openbookqa/ as in the README); without --tasks, the paper's tasks "
                        "whose files are missing are skipped with a warning")
    p.add_argument("--limit", type=_positive_float, default=None, help="documents per task (a fraction if below 1): quick checks only")
    p.add_argument("--num-fewshot", type=_non_negative_int, default=None, help="examples in each prompt (default: the task's, mostly 0)")
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    _add_budget_options(p)
    _add_solver_flags(p)
    p.add_argument("--batch-size", type=_positive_int, default=8)
    p.add_argument("--max-length", type=_positive_int, default=None, help="context window in tokens (default: 2048)")
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

    from .eval.downstream import PAPER_TASKS, downstream_record, paper_table, read_local_sets, run_tasks
    from .models import load_model

    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()] if args.tasks else list(PAPER_TASKS)
    local_sets, skipped = None, {}
    if args.data_dir is not None:
        local_sets, skipped = read_local_sets(tasks, args.data_dir, skip_missing=not args.tasks)
        for reason in skipped.values():
            print(f"warning: skipped {reason}", file=sys.stderr)
        tasks = list(local_sets)
    model = load_model(args.checkpoint)
    _apply_solver_flags(model, args)
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


def _add_jacobian(commands) -> None:
    p = commands.add_parser(
        "jacobian",
        help="state-to-state Jacobian of an SSM layer (Theorem 1): diagonal explicit, dense implicit",
        description=(
            "dh_t/dh_(t-1) of one layer's SSM state (other state parts held fixed), at the states that token "
            "sequences reach in sequential mode; reports the off-diagonal share ||J - diag J||_F / ||J||_F. "
            "Computed in float64. One MODEL: <out>/jacobian.json and <out>/jacobian.png. Several: "
            "<out>/<label>/jacobian.json (and .png) per model, all heatmaps side by side in <out>/jacobian.png."
        ),
    )
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="checkpoint folder, preset:NAME (random weights; implicitlm models list) or JSON model options "
                        "(random weights)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--layer", type=_non_negative_int, default=0, help="layer whose SSM state is analysed (default 0)")
    p.add_argument("--coordinates", type=_positive_int, default=64, help="state coordinates analysed, a seeded random choice")
    p.add_argument("--positions", type=_position_list, default=None, help="comma-separated token positions (default: 4 spread, the last included)")
    p.add_argument("--length", type=_positive_int, default=32, help="tokens per sequence")
    p.add_argument("--count", type=_positive_int, default=4, help="sequences")
    p.add_argument("--words", default=None, metavar="GROUP", help="word-problem tokens over GROUP instead of random tokens")
    p.add_argument("--method", choices=["ift", "unroll"], default="ift",
                   help="implicit-function theorem at the fixed point, or autograd through the iterations")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the random weights, tokens and coordinates")
    # The models are built inside run_jacobian, whose solves are its own: no flag to apply.
    _add_budget_options(p)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_jacobian)


def _run_jacobian(args) -> None:
    from .eval.jacobian import run_jacobian

    records = run_jacobian(
        args.models, args.out, layer=args.layer, coordinates=args.coordinates,
        positions=args.positions, length=args.length, count=args.count,
        words=args.words, method=args.method, max_iter=args.max_iter, tol=args.tol, seed=args.seed,
        progress=not args.no_progress,
    )
    print(f"{'model':<28}{'kind':<10}{'share mean':>12}{'median':>12}{'max':>12}")
    for record in records:
        kind = "implicit" if record["model"]["implicit"] else "explicit"
        metrics = record["metrics"]
        print(f"{record['label']:<28}{kind:<10}{metrics['off_diagonal_share_mean']:>12.3g}"
              f"{metrics['off_diagonal_share_median']:>12.3g}{metrics['off_diagonal_share_max']:>12.3g}")
    print(f"results: {args.out}, heatmaps: {args.out / 'jacobian.png'}")


def _option_sections(trainer: str | None) -> str:
    """The keys of --model and, for a trainer ("words" or "lm"), of --train, with their
    defaults (before a preset changes them) and meanings."""
    from .models.loading import model_options_help
    from .core.schema import dataclass_defaults, option_help

    sections = [model_options_help()]
    if trainer is not None:
        if trainer == "words":
            from .train.word_trainer import WordTrainConfig as config
        else:
            from .train.lm_trainer import LMTrainConfig as config
        title = "training options (--train KEY=VALUE; a preset's values replace these defaults):"
        sections.append(option_help(title, dataclass_defaults(config), config.FIELD_HELP))
    return "\n\n".join(sections)


def _key_value(text: str) -> tuple[str, Any]:
    """KEY=VALUE, the value parsed as JSON where it is JSON (numbers, booleans, lists,
    objects), else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
    # Nested too deep for the parser, or an integer of thousands of digits.
    except (RecursionError, ValueError):
        raise argparse.ArgumentTypeError(f"the value of {key!r} is too deeply nested or too long a number") from None


# Option types: argparse reports their errors as "argument --x: <message>", one line.


def _number(text: str, convert, minimum, strict: bool, expected: str):
    """``convert(text)``, at least ``minimum`` (above it when ``strict``), finite."""
    try:
        value = convert(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= minimum and not (strict and value == minimum)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _number(text, int, 0, True, "a positive integer")


def _non_negative_int(text: str) -> int:
    return _number(text, int, 0, False, "an integer >= 0")


def _positive_float(text: str) -> float:
    return _number(text, float, 0.0, True, "a positive number")


def _fraction(text: str) -> float:
    value = _number(text, float, 0.0, False, "a number in [0, 1]")
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def _list_of(text: str, item, expected: str) -> list:
    try:
        values = [item(v) for v in text.split(",") if v.strip()]
    except argparse.ArgumentTypeError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated {expected}, got {text!r}")
    return values


def _int_list(text: str) -> list[int]:
    return _list_of(text, _positive_int, "positive integers")


def _position_list(text: str) -> list[int]:
    return _list_of(text, _non_negative_int, "integers >= 0")


def _float_list(text: str) -> list[float]:
    return _list_of(text, _positive_float, "positive numbers")


def _training_settings(checkpoint: Path) -> dict[str, Any]:
    """The training options a checkpoint records; none for an imported or hand-made model."""
    from .train.checkpoint import TRAINER_META, read_meta

    return read_meta(checkpoint).get("train", {}) if (checkpoint / TRAINER_META).is_file() else {}


def _require_implicit(model, what: str) -> None:
    if not model.config.implicit:
        raise ValueError(f"{what} needs an implicit model; this checkpoint is explicit")


def _progress(items: list, args) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc="eval", disable=args.no_progress)


def _print_budget_table(rows: list[dict[str, Any]], quality: str) -> None:
    width = max(12, len(quality) + 2)
    print(f"{'length':>8}{'tol':>9}{'max_iter':>10}{quality:>{width}}{'iters used':>12}{'not converged':>15}")
    for row in rows:
        tol = "model" if row["tol"] is None else f"{row['tol']:g}"
        used = f"{row['fp_iterations_mean']:>12.2f}" if "fp_iterations_mean" in row else f"{'-':>12}"
        print(f"{row['length']:>8}{tol:>9}{row['max_iter']:>10}{row[quality]:>{width}.4f}{used}{_missed_cell(row)}")


def _missed_cell(row: dict[str, Any]) -> str:
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


if __name__ == "__main__":
    sys.exit(main())
