"""``implicitlm solver train``: a learned solver (initial guess and mixing) for a trained
implicit checkpoint."""

from __future__ import annotations

from pathlib import Path

from .arguments import add_overwrite_option, positive_float, positive_int, seed
from .shared import add_device_option, check_model_paths, device_in_use, print_device

MIXING_LOSS_NAMES = {"residual": "log relative residual", "distance": "relative distance to the fixed point"}


def add_solver(commands) -> None:
    solver = commands.add_parser("solver", help="learned fixed-point solvers for trained implicit checkpoints")
    p = solver.add_subparsers(title="commands").add_parser(
        "train", help="fit a learned initial guess and mixing to a checkpoint's fixed points, the model frozen")
    p.add_argument("checkpoint", type=Path, help="checkpoint folder or run folder (its newest checkpoint)")
    p.add_argument("--out", type=Path, required=True,
                   help="new checkpoint folder: the model, the learned solver beside its weights, used where it "
                        "saves time")
    p.add_argument("--data", type=Path, default=None,
                   help="the run's token shards (language models) or word file (word problems; default: fresh words)")
    p.add_argument("--steps", type=positive_int, default=100, help="batches solved tightly and fitted to (default: 100)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="sequences per batch (default: 8)")
    p.add_argument("--sequence-length", type=positive_int, default=None,
                   help="tokens per sequence (default: the run's training length; 256 for a checkpoint without one)")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW learning rate, cosine-decayed (default: 1e-3)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the batches and the networks' initialisation")
    p.add_argument("--guess-reads-state", action="store_true",
                   help="the initial guess also reads each block's recurrent state (SSM state or KV cache) through a "
                        "learned query, not only the previous token's fixed point")
    p.add_argument("--mixing-loss", choices=tuple(MIXING_LOSS_NAMES), default="residual",
                   help="what each learned mixing step is fitted to minimise: the log relative residual at its "
                        "iterate (default: what the stop test reads), or the paper's distance to the fixed point")
    add_device_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", action="store_true", help="continue an interrupted fit of --out where it stopped")
    add_overwrite_option(p, "a model already at --out (its files; others stay)")
    p.set_defaults(run=_run_solver_train, check=check_model_paths)


def _run_solver_train(args) -> None:
    from ..train.learned_solver import train_learned_solver

    record = train_learned_solver(
        args.checkpoint, args.out, data=args.data, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        seed=args.seed, sequence_length=args.sequence_length, progress=not args.no_progress, resume=args.resume,
        overwrite=args.overwrite, guess_reads_state=args.guess_reads_state, mixing_loss=args.mixing_loss,
        device=device_in_use(args),
    )
    print_device(record["device"])
    parameters, loss = record["parameters"], record["loss"]
    reads = ", reads the state" if record["guess_reads_state"] else ""
    guess_loss, mixing_loss = loss["guess"], loss["mixing"]
    print(f"learned solver fitted in {record['seconds']:.0f} s: initial guess ({parameters['guess']:,} parameters"
          f"{reads}), relative distance to the fixed point {guess_loss['first']:.3f} -> {guess_loss['last']:.3f}; "
          f"mixing ({parameters['mixing']:,} parameters), mean {MIXING_LOSS_NAMES[record['mixing_loss']]} over its "
          f"steps {mixing_loss['first']:.2f} -> {mixing_loss['last']:.2f}")
    for mode, measured in record["held_out"].items():
        unit, rows = ("per token", "one sequence") if mode == "sequential" else ("per sequence", "the batch")
        print(f"{mode}, on {rows} held out: seconds, passes {unit} (not converged; tokens led to another fixed point)")
        for name, values in measured.items():
            print(f"  {name:<32} {values['seconds']:7.3f} s {values['passes']:6.2f}  "
                  f"({values['unconverged_share']:.1%}; {values['moved_share']:.1%})")
    chosen = ", ".join(f"{mode}: {c['solver']} from {'the guess' if c['initial_guess'] == 'learned' else 'z = 0'}"
                       for mode, c in record["chosen"].items())
    print(f"saved to {args.out}; used by default: {chosen} (--solver / --initial-guess pick any other)")
