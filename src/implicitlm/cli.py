"""The ``implicitlm`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    _quiet_libraries()
    try:
        args.run(args)
    except USER_ERRORS as error:
        # Bad input is reported in one line, never as a traceback.
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"implicitlm: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("implicitlm: interrupted", file=sys.stderr)
        return 130
    return 0


def _quiet_libraries() -> None:
    # Saving and loading a checkpoint is instant; the libraries' own progress bars are noise.
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="implicitlm", description="Implicit language models.")
    commands = parser.add_subparsers(title="commands")
    _add_demo(commands)
    words = commands.add_parser("words", help="word problems (state tracking)").add_subparsers(title="commands")
    _add_words_generate(words)
    _add_words_train(words)
    _add_words_eval(words)
    models = commands.add_parser("models", help="the paper's model presets; import from Hugging Face")
    models = models.add_subparsers(title="commands")
    _add_models_list(models)
    _add_models_show(models)
    _add_models_import(models)
    tokenizer = commands.add_parser("tokenizer", help="tokenizers for language modelling")
    _add_tokenizer_train(tokenizer.add_subparsers(title="commands"))
    corpus = commands.add_parser("corpus", help="language-model corpora as token shards")
    _add_corpus_build(corpus.add_subparsers(title="commands"))
    _add_train(commands)
    lm = commands.add_parser("lm", help="language models: perplexity, the CPU demo").add_subparsers(title="commands")
    _add_lm_eval(lm)
    _add_lm_demo(lm)
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
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--hard-prob", type=float, default=None, help="identity probability of the group part (A5xM)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help=".csv for CSV; any other suffix: memory-mapped .npy")
    p.set_defaults(run=_run_words_generate)


def _run_words_generate(args) -> None:
    from .data.words import generate_words, save_words, write_generated_words

    if args.out.suffix == ".csv":
        inputs, targets = generate_words(args.group, args.length, args.count, args.seed, args.hard_prob)
        save_words(args.out, inputs, targets, {"group": args.group, "seed": args.seed, "hard_prob": args.hard_prob})
    else:
        write_generated_words(args.out, args.group, args.length, args.count, args.seed, args.hard_prob, progress=True)
    print(f"wrote {args.count} words of length {args.length} over {args.group} to {args.out}")


def _add_words_train(commands) -> None:
    p = commands.add_parser("train", help="train a model on a word problem")
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoint, metrics.jsonl, tensorboard")
    p.add_argument("--preset", default=None, help="preset name or JSON with 'model' and 'train' sections")
    p.add_argument("--explicit", action="store_true", help="train the explicit model (one pass, no fixed point)")
    p.add_argument("--data", type=Path, default=None, help="training words (.npy or .csv); default: fresh words")
    p.add_argument("--model", action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.add_argument("--train", action="append", default=[], metavar="KEY=VALUE", help="training option, repeatable")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_words_train)


def _run_words_train(args) -> None:
    from .configs import load_preset
    from .data.groups import get_group
    from .data.words import load_words
    from .train.word_setup import word_model, word_train_config
    from .train.word_trainer import train_words

    preset = load_preset(args.preset) if args.preset else {}
    kind = "explicit" if args.explicit else "implicit"
    train = word_train_config(preset, kind, _key_values(args.train))
    data = load_words(args.data, group=train.group) if args.data else None
    if data is not None and data.group != get_group(train.group).name:
        raise ValueError(f"{args.data}: words over {data.group}, but the training group is {train.group}")
    model = word_model(preset, kind, train, _key_values(args.model))
    metrics = train_words(model, train, args.out, data=data, progress=not args.no_progress)
    print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, str)}))
    print(f"checkpoint: {args.out / 'checkpoint'}")


def _add_words_eval(commands) -> None:
    p = commands.add_parser("eval", help="per-token accuracy of a checkpoint by test length")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--group", default=None, help="group of generated test words (default: from the checkpoint)")
    p.add_argument("--lengths", default=None, help="comma-separated test lengths for generated words")
    p.add_argument("--data", type=Path, action="append", default=[], help="test words file(s) instead")
    p.add_argument("--count", type=int, default=512, help="generated words per length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hard-prob", type=float, default=None)
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    p.add_argument("--max-iter", type=int, default=None, help="fixed-point budget (default: the model's eval budget)")
    p.add_argument("--tol", type=float, default=None, help="fixed-point tolerance (default: the model's)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(run=_run_words_eval)


def _run_words_eval(args) -> None:
    from .data.words import load_words
    from .atomic_io import write_json
    from .eval.words import accuracy_by_length, word_accuracy
    from .train.checkpoint import read_meta
    from .models import load_model

    model = load_model(args.checkpoint)
    options = {"mode": args.mode, "max_iter": args.max_iter, "tol": args.tol, "batch_size": args.batch_size}
    if args.data:
        group = args.group or read_meta(args.checkpoint)["train"]["group"]
        rows = [word_accuracy(model, d.inputs, d.targets, **options) for d in (load_words(p, group) for p in args.data)]
    else:
        group = args.group or read_meta(args.checkpoint).get("train", {}).get("group")
        if not group:
            raise ValueError("--group is needed: the checkpoint does not name its training group")
        if not args.lengths:
            raise ValueError("give --lengths (e.g. 16,32,64) or --data FILE")
        rows = accuracy_by_length(model, group, _int_list(args.lengths), args.count, args.seed, args.hard_prob, **options)
    print(f"{'length':>8}{'accuracy':>10}{'last10':>9}{'fp iters':>10}")
    for row in rows:
        iters = f"{row['fp_iterations_mean']:>10.1f}" if "fp_iterations_mean" in row else f"{'-':>10}"
        print(f"{row['length']:>8}{row['accuracy']:>10.1%}{row['accuracy_last10']:>9.1%}{iters}")
    if args.json:
        write_json(args.json, {"checkpoint": str(args.checkpoint), "group": group, "mode": args.mode, "results": rows})


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
    p.add_argument("--model", action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.set_defaults(run=_run_models_import)


def _run_models_import(args) -> None:
    from .models.convert import from_hf

    model = from_hf(args.source, implicit=args.implicit, **_key_values(args.model))
    model.save_pretrained(args.out)
    kind = "implicit" if model.config.implicit else "explicit"
    print(f"saved the {kind} model ({model.num_parameters() / 1e6:.1f}M parameters) to {args.out}")


def _add_tokenizer_train(commands) -> None:
    p = commands.add_parser("train", help="train a byte-level BPE tokenizer on local text (offline)")
    p.add_argument("sources", nargs="+", help="text / .jsonl / .parquet files or folders")
    p.add_argument("--out", type=Path, required=True, help="tokenizer folder (Hugging Face format)")
    p.add_argument("--vocab-size", type=int, default=32768)
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
    p.add_argument("--test-fraction", type=float, default=0.001, help="share of documents held out (default 0.1%%)")
    p.add_argument("--shard-tokens", type=int, default=2**24, help="tokens per shard file")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
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

    documents = read_documents(args.sources, text_field=args.text_field, split=args.split, pattern=args.pattern)
    write_shards(
        documents, load_tokenizer(args.tokenizer), args.out, shard_tokens=args.shard_tokens,
        test_fraction=args.test_fraction, seed=args.seed, workers=args.workers, progress=not args.no_progress,
        resume=args.resume, overwrite=args.overwrite,
    )
    train, test = TokenShards(args.out, "train"), TokenShards(args.out, "test")
    print(f"wrote {len(train):,} training and {len(test):,} held-out tokens to {args.out}")


def _add_train(commands) -> None:
    p = commands.add_parser("train", help="train a language model on token shards (torchrun for several processes)")
    p.add_argument("--data", type=Path, required=True, help="shard folder (implicitlm corpus build)")
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoints, metrics.jsonl, tensorboard")
    p.add_argument("--model-preset", default=None, help="model preset (implicitlm models list) or JSON file")
    p.add_argument("--config", default=None, help="training preset name or JSON with 'model' and 'train' sections")
    p.add_argument("--model", action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.add_argument("--train", action="append", default=[], metavar="KEY=VALUE", help="training option, repeatable")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run_train)


def _run_train(args) -> None:
    import torch

    from .configs import load_preset
    from .data.shards import TokenShards
    from .models import build_model, config_from_options, load_model
    from .models.presets import model_preset
    from .train.checkpoint import latest_checkpoint
    from .train.lm_trainer import CHECKPOINTS, LMTrainConfig, resume_config, train_lm

    preset = load_preset(args.config) if args.config else {}
    if args.resume:
        # The run's own settings, with any given on the command line on top.
        train = resume_config(args.out, _key_values(args.train))
        model = load_model(latest_checkpoint(args.out / CHECKPOINTS))
    else:
        train = LMTrainConfig.from_dict({**preset.get("train", {}), **_key_values(args.train)})
        options = {}
        if args.model_preset:
            from_file = args.model_preset.endswith(".json")
            options.update(load_preset(args.model_preset) if from_file else model_preset(args.model_preset))
        # The vocabulary is the shards' tokenizer's, unless an option says otherwise.
        options["vocab_size"] = TokenShards(args.data, "train").vocab_size
        options.update({**preset.get("model", {}), **_key_values(args.model)})
        options.setdefault("label_alignment", "shifted")
        torch.manual_seed(train.seed)  # the initial weights are part of the run's seed
        model = build_model(config_from_options(options))
    metrics = train_lm(model, train, args.data, args.out, resume=args.resume, progress=not args.no_progress)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one process reports
        print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, str)}))
        print(f"checkpoints: {args.out / CHECKPOINTS}")


def _add_lm_eval(commands) -> None:
    p = commands.add_parser("eval", help="held-out perplexity of a checkpoint on token shards")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--data", type=Path, required=True, help="shard folder")
    p.add_argument("--split", default="test")
    p.add_argument("--sequence-length", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-batches", type=int, default=None, help="stop after this many batches")
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous")
    p.add_argument("--max-iter", type=int, default=None, help="fixed-point budget (default: the model's eval budget)")
    p.add_argument("--tol", type=float, default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    p.set_defaults(run=_run_lm_eval)


def _run_lm_eval(args) -> None:
    import itertools

    from .atomic_io import write_json
    from .data.shards import TokenShards, evaluation_windows
    from .eval.perplexity import perplexity
    from .models import load_model

    model = load_model(args.checkpoint)
    windows = evaluation_windows(TokenShards(args.data, args.split), args.sequence_length, args.batch_size)
    result = perplexity(model, itertools.islice(windows, args.max_batches), args.mode, args.max_iter, args.tol)
    print(f"{args.split}: loss {result['loss']:.4f}, perplexity {result['perplexity']:.2f} over {result['tokens']:,} tokens")
    if args.json:
        write_json(args.json, {"checkpoint": str(args.checkpoint), "split": args.split, "mode": args.mode, **result})


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


def _key_values(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs, values parsed as JSON where they are JSON (numbers, booleans, lists)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"expected positive lengths, got {text!r}")
    return values


if __name__ == "__main__":
    sys.exit(main())
