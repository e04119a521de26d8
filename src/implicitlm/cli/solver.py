"""``implicitlm solver train``: a learned initial guess for a trained implicit checkpoint."""

from __future__ import annotations

from pathlib import Path

from .arguments import add_overwrite_option, positive_float, positive_int


def add_solver(commands) -> None:
    solver = commands.add_parser("solver", help="learned fixed-point solvers for trained implicit checkpoints")
    p = solver.add_subparsers(title="commands").add_parser(
        "train", help="fit a learned initial guess to a checkpoint's fixed points, the model frozen")
    p.add_argument("checkpoint", type=Path, help="checkpoint folder or run folder (its newest checkpoint)")
    p.add_argument("--out", type=Path, required=True,
                   help="new checkpoint folder: the model, the guess beside its weights, initial_guess=learned")
    p.add_argument("--data", type=Path, default=None,
                   help="the run's token shards (language models) or word file (word problems; default: fresh words)")
    p.add_argument("--steps", type=positive_int, default=100, help="batches solved tightly and fitted to (default: 100)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="sequences per batch (default: 8)")
    p.add_argument("--sequence-length", type=positive_int, default=None,
                   help="tokens per sequence (default: the run's training length; 256 for a checkpoint without one)")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW learning rate, cosine-decayed (default: 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the batches and the guess's initialisation")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", action="store_true", help="continue an interrupted fit of --out where it stopped")
    add_overwrite_option(p, "a folder already at --out")
    p.set_defaults(run=_run_solver_train)


def _run_solver_train(args) -> None:
    from ..train.learned_guess import train_learned_guess

    record = train_learned_guess(
        args.checkpoint, args.out, data=args.data, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        seed=args.seed, sequence_length=args.sequence_length, progress=not args.no_progress, resume=args.resume,
        overwrite=args.overwrite,
    )
    print(f"learned initial guess ({record['parameters']:,} parameters) fitted in {record['seconds']:.0f} s: "
          f"relative distance to the fixed point {record['loss_first']:.3f} -> {record['loss_last']:.3f}")
    for mode in ("simultaneous", "sequential"):
        zero, learned = record["held_out_passes"][f"{mode}_zero"], record["held_out_passes"][f"{mode}_learned"]
        unit = "per token" if mode == "sequential" else "per sequence"
        print(f"{mode}: {zero['passes']:.2f} -> {learned['passes']:.2f} passes {unit} on a held-out batch "
              f"(not converged: {zero['unconverged_share']:.1%} -> {learned['unconverged_share']:.1%}; "
              f"tokens led to another fixed point: {learned['moved_share']:.1%})")
    used = record["used_in"]
    if used:
        print(f"saved to {args.out}, the guess used in {' and '.join(used)} mode (--initial-guess zero: z = 0)")
    else:
        print(f"saved to {args.out} with the guess OFF: in neither mode did it save passes without leading some "
              "held-out token to another fixed point than z = 0 (more --steps may mend it; --initial-guess learned "
              "uses it anyway)")
