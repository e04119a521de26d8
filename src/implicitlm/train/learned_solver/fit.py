"""Training a learned solver for a trained implicit checkpoint, the model frozen, on the
batches of the run's own task (token shards, or words): a learned initial guess
(``models.learned_solver.InitialGuess``) and a learned mixing of safeguarded Anderson's steps
(``models.learned_solver.LearnedMixing``, the solver "learned_anderson"), after Bai, Koltun and
Kolter's *Neural Deep Equilibrium Solvers*.

Each step draws a batch as the run's training did and solves its fixed point tightly
(``TIGHT_TOL``, from z = 0); the guess is fitted to those fixed points (``guess_fit``), then
the mixing to the batch's maps (``mixing_fit``).

The output is a new checkpoint folder: the model as it was, both networks beside its weights
and, per mode, where the solve starts and which solver mixes its steps, chosen on a held-out
batch (``comparison``). ``learned_solver.json`` records the fit and that comparison.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ...core.atomic_io import staged_directory, write_json
from ...core.devices import usable_device
from ...core.errors import DataError, OptionError
from ...core.memory import activation_bytes, require
from ...core.run_folder import TRAINER_META, model_folder, read_trainer_meta
from ...core.targets import TargetExistsError, exclusive_target
from ...core.weights_digest import weights_sha256
from ...deq.solvers.anderson import MEMORY
from ...models import load_model
from ...models.convert import MODEL_FOLDER
from ...models.learned_solver import InitialGuess, LearnedMixing, without_learned_solver
from ...tasks import TRAINING
from ..config import TrainConfig
from .guess_fit import fit_guess
from .mixing_fit import MIXING_LOSSES, fit_mixing, mixing_improved
from ..model_card import write_model_card
from .comparison import MODES, choose_per_mode, compare_configurations, solver_name
from .progress import PROGRESS_EVERY, FitState, discard_progress, progress_folder, restore_progress, save_progress
from ..trainer import checkpoint_config

TIGHT_TOL = 1e-4  # the fixed points the solver learns: well below any inference tolerance in use
TIGHT_MAX_ITER = 400
RECORD = "learned_solver.json"
DEFAULT_SEQUENCE_LENGTH = 256
# Word problems are also checked for another fixed point at this multiple of the training
# length, the longest the handbook evaluates: on the S3 model a guess reached the fixed points
# of z = 0 at 1x-4x and moved a few words' at 8x and 16x.
LONGER_MULTIPLE = 16
LONGER_COUNT = 256  # the handbook's --count: one word in 256 reached another fixed point at 8x-16x
# Bytes of a token id in a batch: int64, as torch embeds it.
INPUT_BYTES = 8
# Files of the source checkpoint that the saved model does not write itself.
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "trainer.json")


def train_learned_solver(
    source: str | Path, out: str | Path, data: str | Path | None = None, steps: int = 100, batch_size: int = 8,
    lr: float = 1e-3, seed: int = 0, sequence_length: int | None = None, progress: bool = True, resume: bool = False,
    overwrite: bool = False, guess_reads_state: bool = False, mixing_loss: str = "residual", device: str | None = None,
) -> dict[str, Any]:
    """Fit a learned initial guess and mixing to the fixed points of the checkpoint (or run)
    ``source`` and save the checkpoint with them in ``out``; returns the record written there.
    ``data``: the run's token shards (language models), or a word file (word problems; None:
    fresh words as the run drew them). ``sequence_length``: of each batch's sequences
    (default: the run's training length; a checkpoint without training settings, such as an
    imported one, is a language model read ``DEFAULT_SEQUENCE_LENGTH`` tokens at a time).
    ``resume``: continue the fit an interruption left (``progress``).
    ``guess_reads_state``: the guess also reads each block's recurrent state before the token
    (``InitialGuess``'s ``readouts``), not only the previous fixed point.
    ``mixing_loss``: what each learned step is fitted to minimise (``MIXING_LOSSES``).
    ``device``: where the model and the fit run (``usable_device``'s names; None: the CPU)."""
    if steps < 1 or batch_size < 1:
        raise OptionError(f"steps and batch_size must be at least 1; got {steps} and {batch_size}",
                          arguments=("steps", "batch_size"))
    if mixing_loss not in MIXING_LOSSES:
        raise OptionError(f"mixing_loss must be one of {', '.join(MIXING_LOSSES)}; got {mixing_loss!r}",
                          arguments=("mixing_loss",))
    # Absolute, taken now: an out of "." is the folder the save replaces, and the current
    # folder then one that no longer exists.
    out = os.path.abspath(out)
    with exclusive_target(out, overwrite, MODEL_FOLDER):
        checkpoint = model_folder(source)
        model = load_model(checkpoint).eval().requires_grad_(False).to(usable_device(device))
        if not model.config.implicit:
            raise OptionError(f"{source}: an explicit model has no fixed point to guess")
        own = _own_solvers(model)
        # The tight solves start from z = 0 with the checkpoint's own solvers, whatever it had learned.
        model.attach_learned_guess(None)
        model.attach_learned_mixing(None)
        model.set_fixed_point_options(**{f"{mode}_solver": own[mode] for mode in MODES})
        config = _batch_settings(checkpoint, batch_size, seed, sequence_length)
        _require_fit_memory(model, config)
        batches = TRAINING[config.task].batches_class().from_path(config, data)
        batches.prepare(model)
        torch.manual_seed(seed)
        readouts = model.stack.readout_sizes() if guess_reads_state else ()
        guess = InitialGuess(model.config.hidden_size, readouts=readouts).to(model.device)
        mixing = LearnedMixing(MEMORY).to(model.device)
        settings = {"source": str(checkpoint.resolve()), "weights_sha256": weights_sha256(checkpoint),
                    "data": None if data is None else str(Path(data).resolve()), "steps": steps,
                    "batch_size": batch_size, "lr": lr, "seed": seed, "sequence_length": config.sequence_length,
                    "guess_reads_state": guess_reads_state, "mixing_loss": mixing_loss}
        started = time.perf_counter()
        state = _fit(model, guess, mixing, batches, settings, progress_folder(out), progress, resume, overwrite)
        held_out, _ = next(batches)
        longer = batches.longer_inputs(LONGER_MULTIPLE, LONGER_COUNT)
        model.attach_learned_guess(guess, use=None)
        model.attach_learned_mixing(mixing)
        record = {
            **{key: settings[key] for key in ("steps", "batch_size", "sequence_length", "lr", "seed",
                                              "guess_reads_state", "mixing_loss")},
            "source": str(checkpoint), "device": str(model.device), "seconds": round(time.perf_counter() - started, 1),  # of this call's part
            "parameters": {"guess": _parameters(guess), "mixing": _parameters(mixing)}, "tight_tol": TIGHT_TOL,
            "tight_unconverged_share": state.missed / max(state.solved, 1),
            "loss": {name: {"first": losses[0], "last": sum(losses[-10:]) / len(losses[-10:])}
                     for name, losses in state.losses.items()},
            "held_out": compare_configurations(model, own, held_out, longer),
        }
        record["mixing_improved"] = mixing_improved(record["loss"]["mixing"], mixing_loss)
        record["chosen"] = {mode: {"initial_guess": start, "solver": solver_name(solver, own, mode)}
                            for mode, (start, solver) in
                            choose_per_mode(record["held_out"], record["mixing_improved"]).items()}
        model.set_fixed_point_options(initial_guess="zero", **{
            f"{mode}_{key}": value for mode, chosen in record["chosen"].items() for key, value in chosen.items()})
        _save(out, checkpoint, model, record)
        discard_progress(progress_folder(out))
    return record


def _own_solvers(model) -> dict[str, str]:
    """The checkpoint's solver per mode as it solves without a learned solver: where it mixed
    by a learned mixing already, the solver that solves in its place."""
    options = model.solver.options
    without = options.replace(**without_learned_solver(options))
    return {mode: without.solver_for(mode) for mode in MODES}


def _parameters(network: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in network.parameters())


def _save(out: str | Path, checkpoint: Path, model, record: dict[str, Any]) -> None:
    """The model with its learned solver, the source's tokenizer and training settings, a
    model card and the record, built aside and renamed into ``out``."""
    with staged_directory(out, MODEL_FOLDER.keeps) as staging:
        for name in COPIED:
            if (checkpoint / name).is_file():
                shutil.copyfile(checkpoint / name, staging / name)  # a new file's mode: the umask's, not the source's
        model.save_pretrained(staging)  # after the tokenizer: it records their digests
        write_model_card(staging, model, read_trainer_meta(checkpoint) if (checkpoint / TRAINER_META).is_file() else {})
        write_json(staging / RECORD, record)


def _batch_settings(checkpoint: Path, batch_size: int, seed: int, sequence_length: int | None) -> TrainConfig:
    """The run's training settings with this batch size and seed (and sequence length, if given)."""
    changes = {"batch_size": batch_size, "seed": seed, **({} if sequence_length is None else {"sequence_length": sequence_length})}
    if (checkpoint / TRAINER_META).is_file():
        return checkpoint_config(checkpoint, changes)
    return TrainConfig.for_task("lm", **{"sequence_length": DEFAULT_SEQUENCE_LENGTH, **changes})


def _require_fit_memory(model, config: TrainConfig) -> None:
    """Refuse, before a batch is drawn, a batch whose tight solves cannot fit: Anderson keeps
    ``MEMORY`` iterates of the batch's fixed point and their images (a lower bound)."""
    tokens = config.batch_size * config.sequence_length
    require(f"fitting a learned solver at {config.batch_size:,} x {config.sequence_length:,} tokens per batch",
            activation_bytes(config.batch_size, config.sequence_length, model.config.hidden_size, 1, 2 * MEMORY)
            + INPUT_BYTES * tokens, model.device, arguments=("batch_size", "sequence_length"))


def _fit(model, guess: InitialGuess, mixing: LearnedMixing, batches, settings: dict[str, Any], kept: Path,
         progress: bool, resume: bool, overwrite: bool) -> FitState:
    """AdamW on both networks, each learning rate cosine-decayed over its updates, each
    update's mask of known previous fixed points drawn from (seed, update): a fit continued
    from ``kept`` goes on exactly as it would have. The state also counts the tight solves
    that stopped above ``TIGHT_TOL`` (their points are learnt as they are)."""
    steps, lr = settings["steps"], settings["lr"]
    fitted = {name: (network, torch.optim.AdamW(network.parameters(), lr=lr, weight_decay=0.0))
              for name, network in (("guess", guess), ("mixing", mixing))}
    if resume:
        if not kept.exists():
            raise DataError(f"{kept}: no interrupted fit to continue", arguments=("resume",))
        state = restore_progress(kept, settings, fitted, batches)
    elif kept.exists() and not overwrite:
        raise TargetExistsError(f"{kept}: an interrupted fit of this target; continue it with resume=True or start "
                                "again with overwrite=True", arguments=("resume", "overwrite"))
    else:
        state = FitState()
    for batch in tqdm(range(state.batches_done, steps), desc="learned solver", disable=not progress,
                      initial=state.batches_done, total=steps):
        inputs, _ = next(batches)
        embedded, z_star, stats = model.solve_fixed_point(inputs, max_iter=TIGHT_MAX_ITER, tol=TIGHT_TOL)
        state.missed, state.solved = state.missed + int((~stats.converged).sum()), state.solved + stats.converged.numel()
        reader = model.state_reader(embedded, z_star) if guess.reads_state else None
        fit_guess(guess, fitted["guess"][1], embedded, z_star, reader, state, settings)
        # From z = 0 on even batches, from the guess on odd ones: the mixing serves both starts.
        fit_mixing(model, mixing, fitted["mixing"][1], inputs, z_star, None if batch % 2 == 0 else guess, state,
                    settings)
        state.batches_done += 1
        if state.batches_done % PROGRESS_EVERY == 0 and state.batches_done < steps:
            save_progress(kept, settings, state, fitted, batches)
    return state
