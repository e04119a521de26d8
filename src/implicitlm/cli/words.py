"""``implicitlm demo`` and ``implicitlm words ...``: word problems (state tracking)."""

from __future__ import annotations

import json
from pathlib import Path

from .arguments import add_run_options, fraction, non_negative_int, positive_int
from .shared import check_resume_or_overwrite


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
    from ..data.word_storage import write_generated_words

    write_generated_words(
        args.out, args.group, args.length, args.count, args.seed, args.hard_prob, progress=True, targets=args.targets
    )
    print(f"wrote {args.count} words of length {args.length} over {args.group} to {args.out}")


def add_words_train(commands) -> None:
    p = commands.add_parser("train", help="train a model on a word problem")
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoints, metrics.jsonl, tensorboard")
    p.add_argument("--preset", default=None, help="preset name, JSON with 'model' and 'train' sections, or a checkpoint")
    p.add_argument("--explicit", action="store_true", help="train the explicit model (one pass, no fixed point)")
    p.add_argument("--data", type=Path, default=None, help="training words (.npy or .csv); default: fresh words")
    add_run_options(p, "words")
    p.set_defaults(run=_run_words_train)


def _run_words_train(args) -> None:
    from ..train.runs import train_words_run

    check_resume_or_overwrite(args)
    metrics = train_words_run(
        args.out, preset=args.preset, explicit=args.explicit, data=args.data, model_options=dict(args.model),
        train_options=dict(args.train), resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
    )
    print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, str)}))
    print(f"checkpoints: {args.out / 'checkpoints'}")

