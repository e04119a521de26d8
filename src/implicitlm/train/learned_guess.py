"""Training a learned initial guess (``deq.InitialGuess``) for a trained implicit checkpoint,
the model frozen, on the batches of the run's own task (token shards, or words).

Each step draws a batch as the run's training did, solves its fixed point tightly
(``TIGHT_TOL``, from z = 0), and fits the guess to it (``UPDATES_PER_BATCH`` updates): the loss is each token's distance
to its fixed point relative to the fixed point's norm (the initial-guess loss of Bai et
al.). Half the tokens see the previous token's fixed point, half a zero vector in its
place, since a simultaneous solve does not know it yet and a sequential one does.

The output is a new checkpoint folder: the model as it was, the guess beside its weights
and ``fixed_point.initial_guess = "learned"`` in its config, so loading it starts every
inference solve from the guess; ``learned_guess.json`` records the training and the passes
a held-out batch needed from z = 0 and from the guess. A map may have several fixed points,
and a guess may cost passes in one mode while it saves them in the other: the guess is used
by default only in the modes where, on that batch, it led no token to another fixed point
than z = 0 does and needed no more passes (``used_in`` in the record; the per-mode
``simultaneous_initial_guess`` / ``sequential_initial_guess`` in the config); it is saved in
any case, and ``initial_guess="learned"`` turns it on everywhere.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..core.atomic_io import staged_directory, write_json
from ..core.errors import DataError, OptionError
from ..core.run_folder import TRAINER_META, model_folder, read_trainer_meta
from ..core.targets import TargetExistsError, exclusive_target
from ..core.weights_digest import weights_sha256
from ..deq import InitialGuess
from ..models import load_model
from ..tasks import TRAINING_BATCHES
from .config import TrainConfig
from .guess_progress import PROGRESS_EVERY, FitState, discard_progress, progress_folder, restore_progress, save_progress
from .model_card import write_model_card
from .trainer import checkpoint_config

TIGHT_TOL = 1e-4  # the fixed points the guess learns: well below any inference tolerance in use
TIGHT_MAX_ITER = 400
# Updates of the guess per batch solved: a tight solve costs a dozen passes of the model, an
# update of the guess a small fraction of one.
UPDATES_PER_BATCH = 8
RECORD = "learned_guess.json"
# A token's logits from the guess this far (relative) from those from z = 0 went to another
# fixed point; a solve to the same one, at the tolerances in use, moves them by a few percent.
MOVED = 0.25
MODES = ("simultaneous", "sequential")
DEFAULT_SEQUENCE_LENGTH = 256
# Files of the source checkpoint that the saved model does not write itself.
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "trainer.json")


def train_learned_guess(
    source: str | Path, out: str | Path, data: str | Path | None = None, steps: int = 100, batch_size: int = 8,
    lr: float = 1e-3, seed: int = 0, sequence_length: int | None = None, progress: bool = True, resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Fit a learned initial guess to the fixed points of the checkpoint (or run) ``source``
    and save the checkpoint with it in ``out``; returns the record written there. ``data``:
    the run's token shards (language models), or a word file (word problems; None: fresh
    words as the run drew them). ``sequence_length``: of each batch's sequences (default: the
    run's training length; a checkpoint without training settings, such as an imported one,
    is a language model read ``DEFAULT_SEQUENCE_LENGTH`` tokens at a time). ``resume``:
    continue the fit an interruption left (``guess_progress``)."""
    if steps < 1 or batch_size < 1:
        raise OptionError(f"steps and batch_size must be at least 1; got {steps} and {batch_size}",
                          arguments=("steps", "batch_size"))
    with exclusive_target(out, overwrite):
        checkpoint = model_folder(source)
        model = load_model(checkpoint).eval().requires_grad_(False)
        if not model.config.implicit:
            raise OptionError(f"{source}: an explicit model has no fixed point to guess")
        model.attach_learned_guess(None)  # the tight solves start from z = 0, whatever the checkpoint had
        config = _batch_settings(checkpoint, batch_size, seed, sequence_length)
        batches = TRAINING_BATCHES[config.task].from_path(config, data)
        batches.prepare(model)
        torch.manual_seed(seed)
        guess = InitialGuess(model.config.hidden_size)
        settings = {"source": str(checkpoint.resolve()), "weights_sha256": weights_sha256(checkpoint),
                    "data": None if data is None else str(Path(data).resolve()), "steps": steps,
                    "batch_size": batch_size, "lr": lr, "seed": seed, "sequence_length": config.sequence_length}
        started = time.perf_counter()
        state = _fit(model, guess, batches, settings, progress_folder(out), progress, resume, overwrite)
        held_out, _ = next(batches)
        record = {
            **{key: settings[key] for key in ("steps", "batch_size", "sequence_length", "lr", "seed")},
            "source": str(checkpoint), "seconds": round(time.perf_counter() - started, 1),  # of this call's part
            "parameters": sum(p.numel() for p in guess.parameters()), "tight_tol": TIGHT_TOL,
            "tight_unconverged_share": state.missed / max(state.solved, 1),
            "loss_first": state.losses[0], "loss_last": sum(state.losses[-10:]) / len(state.losses[-10:]),
            "held_out_passes": passes_with_and_without(model, guess, held_out),
        }
        record["used_in"] = modes_it_serves(record["held_out_passes"])
        model.attach_learned_guess(guess, use=len(record["used_in"]) == len(MODES))
        if 0 < len(record["used_in"]) < len(MODES):
            model.set_fixed_point_options(**{f"{mode}_initial_guess": "learned" for mode in record["used_in"]})
        _save(out, checkpoint, model, record)
        discard_progress(progress_folder(out))
    return record


def _save(out: str | Path, checkpoint: Path, model, record: dict[str, Any]) -> None:
    """The model with its guess, the source's tokenizer and training settings, a model card
    and the record, built aside and renamed into ``out``."""
    with staged_directory(out) as staging:
        model.save_pretrained(staging)
        for name in COPIED:
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, staging / name)
        write_model_card(staging, model, read_trainer_meta(checkpoint) if (checkpoint / TRAINER_META).is_file() else {})
        write_json(staging / RECORD, record)


def modes_it_serves(passes: dict[str, dict[str, float]]) -> list[str]:
    """The modes in which the guess is used by default: where, on the held-out batch, it led
    no token to another fixed point than z = 0 and needed no more passes than z = 0."""
    return [mode for mode in MODES if passes[f"{mode}_learned"]["moved_share"] == 0
            and passes[f"{mode}_learned"]["passes"] <= passes[f"{mode}_zero"]["passes"]]


def _batch_settings(checkpoint: Path, batch_size: int, seed: int, sequence_length: int | None) -> TrainConfig:
    """The run's training settings with this batch size and seed (and sequence length, if given)."""
    changes = {"batch_size": batch_size, "seed": seed, **({} if sequence_length is None else {"sequence_length": sequence_length})}
    if (checkpoint / TRAINER_META).is_file():
        return checkpoint_config(checkpoint, changes)
    return TrainConfig.for_task("lm", **{"sequence_length": DEFAULT_SEQUENCE_LENGTH, **changes})


def _fit(model, guess: InitialGuess, batches, settings: dict[str, Any], kept: Path, progress: bool, resume: bool,
         overwrite: bool) -> FitState:
    """AdamW on the guess's relative distance to each batch's tight fixed points, the learning
    rate cosine-decayed over every update, each update's mask of known previous fixed points
    drawn from (seed, update): a fit continued from ``kept`` goes on exactly as it would have.
    The state also counts the tight solves that stopped above ``TIGHT_TOL`` (their points are
    learnt as they are)."""
    steps, lr, seed = settings["steps"], settings["lr"], settings["seed"]
    optimizer = torch.optim.AdamW(guess.parameters(), lr=lr, weight_decay=0.0)
    if resume:
        if not kept.exists():
            raise DataError(f"{kept}: no interrupted fit to continue", arguments=("resume",))
        state = restore_progress(kept, settings, guess, optimizer, batches)
    elif kept.exists() and not overwrite:
        raise TargetExistsError(f"{kept}: an interrupted fit of this target; continue it with resume=True or start "
                                "again with overwrite=True", arguments=("resume", "overwrite"))
    else:
        state = FitState()
    updates = steps * UPDATES_PER_BATCH
    for _ in tqdm(range(state.batches_done, steps), desc="learned guess", disable=not progress,
                  initial=state.batches_done, total=steps):
        inputs, _ = next(batches)
        embedded, z_star, stats = model.solve_fixed_point(inputs, max_iter=TIGHT_MAX_ITER, tol=TIGHT_TOL)
        state.missed, state.solved = state.missed + int((~stats.converged).sum()), state.solved + stats.converged.numel()
        previous = torch.cat([torch.zeros_like(z_star[:, :1]), z_star[:, :-1]], dim=1)
        for _ in range(UPDATES_PER_BATCH):
            update = len(state.losses)
            draw = torch.Generator().manual_seed(seed * 1_000_003 + update)
            known = (torch.rand(z_star.shape[:2], generator=draw) < 0.5).to(z_star.device)
            for group in optimizer.param_groups:
                group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * update / updates))
            loss = _relative_distance(guess(embedded, previous * known.unsqueeze(-1)), z_star)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            state.losses.append(loss.item())
        state.batches_done += 1
        if state.batches_done % PROGRESS_EVERY == 0 and state.batches_done < steps:
            save_progress(kept, settings, state, guess, optimizer, batches)
    return state


def _relative_distance(guess: torch.Tensor, z_star: torch.Tensor) -> torch.Tensor:
    return ((guess.float() - z_star.float()).norm(dim=-1) / (z_star.float().norm(dim=-1) + 1e-6)).mean()


def passes_with_and_without(model, guess: InitialGuess, inputs: torch.Tensor) -> dict[str, dict[str, float]]:
    """Mean passes of the map per solve (simultaneous: per sequence; sequential: per token)
    at the model's own inference budget, from z = 0 and from ``guess``, with the share of
    solves above the tolerance; and, from the guess, the share of tokens whose logits
    ``MOVED`` from those of the solve from z = 0 (another fixed point: a map may have several,
    and the model's answers are those of the one z = 0 leads to)."""
    measured, logits = {}, {}
    for start, attached in (("zero", None), ("learned", guess)):
        model.attach_learned_guess(attached)
        for mode in MODES:
            with torch.no_grad():
                output = model(inputs, mode=mode)
            logits[mode, start] = output.logits.float()
            measured[f"{mode}_{start}"] = {
                "passes": round(output.fixed_point.iterations.float().mean().item(), 3),
                "unconverged_share": round((~output.fixed_point.converged).float().mean().item(), 4),
            }
            if start == "learned":
                reference = logits[mode, "zero"]
                moved = (logits[mode, start] - reference).norm(dim=-1) > MOVED * reference.norm(dim=-1)
                measured[f"{mode}_{start}"]["moved_share"] = round(moved.float().mean().item(), 4)
    return measured
