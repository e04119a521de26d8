"""``implicitlm demo`` and ``implicitlm words ...``: word problems (state tracking)."""

from __future__ import annotations

from pathlib import Path

from .arguments import add_overwrite_option, add_run_options, fraction, positive_int, preset_name, seed
from .shared import add_demo_command, add_device_option, check_run_options, device_in_use, print_run_summary, report_demo


def add_demo(commands) -> None:
    add_demo_command(commands, "implicit vs explicit Mamba2 on a word problem, accuracy by length", "demo", _run_demo)


def _run_demo(args) -> None:
    from ..recipes.words import format_table, run_demo

    report_demo(args, run_demo, format_table, "accuracy_by_length.png")


def add_words_generate(commands) -> None:
    p = commands.add_parser("generate", help="generate word-problem data")
    p.add_argument("--group", required=True, help="e.g. S5, A5, Z6, S3xZ2, A5xM")
    p.add_argument("--length", type=positive_int, required=True, help="tokens per word")
    p.add_argument("--count", type=positive_int, required=True, help="words to generate")
    p.add_argument("--hard-prob", type=fraction, default=None, help="identity probability of the group part (A5xM)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the words drawn (default: 0)")
    p.add_argument("--out", type=Path, required=True, help=".csv for CSV; any other suffix: memory-mapped .npy")
    p.add_argument(
        "--targets", choices=("stored", "derived"), default="stored",
        help="derived: store only the inputs (half the size, .npy only); labels are computed when read",
    )
    add_overwrite_option(p, "a word file already at --out (and its .json metadata)")
    p.set_defaults(run=_run_words_generate)


def _run_words_generate(args) -> None:
    from ..data.word_storage import write_generated_words

    write_generated_words(
        args.out, args.group, args.length, args.count, args.seed, args.hard_prob, progress=True, targets=args.targets,
        overwrite=args.overwrite,
    )
    print(f"wrote {args.count} words of length {args.length} over {args.group} to {args.out}")


def add_words_train(commands) -> None:
    p = commands.add_parser("train", help="train a model on a word problem")
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoints, metrics.jsonl, tensorboard")
    p.add_argument("--preset", type=preset_name, default=None, help="preset name, JSON with 'model' and 'train' sections, or a checkpoint")
    p.add_argument("--explicit", action="store_true", help="train the explicit model (one pass, no fixed point)")
    p.add_argument("--data", type=Path, default=None, help="training words (.npy or .csv); default: fresh words")
    p.add_argument(
        "--init-from", type=Path, default=None, metavar="CHECKPOINT",
        help="start from this checkpoint's (or run's) model and weights, --model options on top, on the group, "
             "lengths and batches its run trained on; the preset gives the other training settings (a second stage)",
    )
    add_run_options(p, "words")
    add_device_option(p)
    p.set_defaults(run=_run_words_train, check=check_run_options)


def _run_words_train(args) -> None:
    from ..train.runs import train_words_run

    device = device_in_use(args)
    metrics = train_words_run(
        args.out, preset=args.preset, explicit=args.explicit, data=args.data, model_options=dict(args.model),
        train_options=dict(args.train), init_from=args.init_from, resume=args.resume, overwrite=args.overwrite,
        progress=not args.no_progress, device=device,
    )
    print_run_summary(metrics, args.out, device)

