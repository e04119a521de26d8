"""``implicitlm tokenizer``, ``corpus`` and ``catbabi``: the data commands."""

from __future__ import annotations

import os
from pathlib import Path

from .arguments import add_overwrite_option, fraction, int_list, positive_int, seed, tokenizer_name
from .evaluate import add_aliases

PATTERN_HELP = "file name pattern inside folders, recursively (default: every file; e.g. '*.txt')"


def add_tokenizer_train(commands) -> None:
    p = commands.add_parser("train", help="train a byte-level BPE tokenizer on local text (offline)")
    p.add_argument("sources", nargs="+", help="text / .jsonl / .parquet files or folders")
    p.add_argument("--out", type=Path, required=True, help="tokenizer folder (Hugging Face format)")
    add_overwrite_option(p, "what --out holds: the tokenizer's files replace theirs, other files stay")
    p.add_argument("--vocab-size", type=positive_int, default=32768,
                   help="tokens in the vocabulary, the end-of-text token included (default: 32768)")
    p.add_argument("--text-field", default="text", help="field holding the text in JSONL / Parquet")
    p.add_argument("--pattern", default="*", help=PATTERN_HELP)
    _add_errors(p)
    p.set_defaults(run=_run_tokenizer_train)


def _add_errors(p) -> None:
    p.add_argument(
        "--errors", choices=("strict", "replace"), default="strict",
        help="bytes that are not UTF-8: an error naming the file and line (strict), or U+FFFD, counted (replace)",
    )


def _run_tokenizer_train(args) -> None:
    from ..data.corpus import read_documents
    from ..data.tokenizer import train_tokenizer

    documents = read_documents(
        args.sources, text_field=args.text_field, pattern=args.pattern, errors=args.errors, require_text=True
    )
    # In pieces, as the shards are written: a long document is not handed to the trainer whole.
    tokenizer = train_tokenizer(documents.pieces(), args.vocab_size, args.out, overwrite=args.overwrite)
    replaced = _replaced(args, documents)
    print(f"saved a tokenizer of {len(tokenizer)} tokens to {args.out}" + (f" ({replaced})" if replaced else ""))


def _replaced(args, *documents) -> str:
    """What --errors replace replaced, for the summary line; "" without it."""
    if args.errors != "replace":
        return ""
    undecodable = sum(read.replaced_bytes for read in documents)
    lines = sum(read.replaced_lines for read in documents)
    return f"replaced {undecodable:,} undecodable byte{'s' * (undecodable != 1)} in {lines:,} line{'s' * (lines != 1)}"


def add_corpus_build(commands) -> None:
    p = commands.add_parser("build", help="tokenize documents into packed, memory-mapped token shards")
    p.add_argument("sources", nargs="+", help="text / .jsonl / .parquet files or folders, or a hub dataset name")
    p.add_argument("--tokenizer", type=tokenizer_name, required=True, help="tokenizer folder or hub name (e.g. EleutherAI/gpt-neox-20b)")
    p.add_argument("--out", type=Path, required=True, help="shard folder")
    held_out = p.add_mutually_exclusive_group()
    held_out.add_argument(
        "--test-fraction", type=fraction, default=0.001,
        help="share of documents held out (default 0.1%%); if none is drawn, the last lines of the last one",
    )
    held_out.add_argument(
        "--test-sources", nargs="+", metavar="SOURCE",
        help="the test split's own documents (e.g. a validation file); all of the sources are then trained on",
    )
    p.add_argument("--shard-tokens", type=positive_int, default=2**24, help="tokens per shard file")
    p.add_argument("--workers", type=positive_int, default=1, help="tokenizer processes")
    p.add_argument("--seed", type=seed, default=0, help="seed of the train/test split")
    p.add_argument("--text-field", default="text", help="field holding the text in JSONL / Parquet / datasets")
    p.add_argument("--pattern", default="*", help=PATTERN_HELP)
    p.add_argument("--split", default="train", help="split of a hub dataset")
    _add_errors(p)
    p.add_argument("--resume", action="store_true", help="continue an interrupted build")
    p.add_argument("--overwrite", action="store_true", help="replace a finished build")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_corpus_build)


def _run_corpus_build(args) -> None:
    from ..data.corpus import check_held_out_apart, read_documents
    from ..data.shard_writer import write_shards
    from ..data.shards import TokenShards
    from ..data.tokenizer import load_tokenizer

    def documents(sources):
        return read_documents(
            sources, text_field=args.text_field, split=args.split, pattern=args.pattern,
            errors=args.errors, require_text=True,
        )

    if args.test_sources:
        check_held_out_apart(args.sources, args.test_sources, args.pattern)
    train_documents = documents(args.sources)
    test_documents = documents(args.test_sources) if args.test_sources else None
    # Absolute, taken now: an --out of "." is the folder the build replaces, and the current
    # folder then one that no longer exists.
    out = os.path.abspath(args.out)
    index = write_shards(
        train_documents, load_tokenizer(args.tokenizer), out, shard_tokens=args.shard_tokens,
        test_fraction=args.test_fraction, seed=args.seed, workers=args.workers, progress=not args.no_progress,
        resume=args.resume, overwrite=args.overwrite, test_documents=test_documents,
    )
    train, test = TokenShards(out, "train"), TokenShards(out, "test")
    read = [train_documents] if test_documents is None else [train_documents, test_documents]
    notes = "; ".join(note for note in (_held_out(args, index), _replaced(args, *read)) if note)
    print(f"wrote {len(train):,} training and {len(test):,} held-out tokens to {args.out} ({notes})")


def _held_out(args, index) -> str:
    """How the held-out split was chosen, for the summary line."""
    if args.test_sources:
        return "held out: " + ", ".join(args.test_sources)
    tail = index.get("held_out_tail")
    if tail:
        return f"held out: the last {tail['lines']:,} of the last document's {tail['of']:,} lines"
    test, documents = index["splits"]["test"]["documents"], index["documents"]
    return f"held out: {test:,} of {documents:,} documents"


def add_catbabi(commands) -> None:
    catbabi = commands.add_parser("catbabi", help="catbAbI: the 20 bAbI tasks as one language-modelling stream")
    catbabi = catbabi.add_subparsers(title="commands")
    p = catbabi.add_parser("build", help="bAbI v1.2 task files (en-valid or en-valid-10k) -> a folder for `train --data`")
    p.add_argument("babi_dir", type=Path, help="folder of qaN_train.txt, qaN_valid.txt, qaN_test.txt")
    p.add_argument("--out", type=Path, required=True, help="catbAbI folder: token shards, tokenizer, answer positions")
    p.add_argument("--tasks", type=int_list, default=None, help="comma-separated task ids (default: all 20)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the story order")
    p.add_argument("--overwrite", action="store_true", help="replace a built folder")
    p.set_defaults(run=_run_catbabi_build)
    p = catbabi.add_parser("sample", help="write the tiny bAbI-format sample shipped for tests (tasks 1, 6, 8, 15, 19)")
    p.add_argument("--out", type=Path, required=True, help="folder for the sample's task files")
    add_overwrite_option(p, "what an earlier run of it wrote in --out (other files stay)")
    p.set_defaults(run=_run_catbabi_sample)
    add_aliases(catbabi, "catbabi")  # catbabi eval: eval length --task catbabi


def _run_catbabi_build(args) -> None:
    from ..data.catbabi import build_catbabi

    tasks = args.tasks
    summary = build_catbabi(args.babi_dir, args.out, tasks=tasks, seed=args.seed, overwrite=args.overwrite)
    for split, counts in summary["splits"].items():
        print(f"{split}: {counts['stories']:,} stories, {counts['answers']:,} answers")
    print(f"valid stories: {summary['valid']}")
    print(f"vocabulary: {summary['vocab_size']} tokens; wrote {args.out}")


def _run_catbabi_sample(args) -> None:
    from ..data.babi_sample import write_babi_sample

    write_babi_sample(args.out, overwrite=args.overwrite)
    print(f"wrote the bAbI-format sample to {args.out} (build it with --tasks 1,6,8,15,19)")
