"""Training a learned solver for a trained implicit checkpoint, the model frozen, on the
batches of the run's own task (token shards, or words): a learned initial guess
(``deq.InitialGuess``) and a learned mixing of safeguarded Anderson's steps
(``deq.LearnedMixing``, the solver "learned_anderson"), after Bai, Koltun and Kolter's
*Neural Deep Equilibrium Solvers*.

Each step draws a batch as the run's training did and solves its fixed point tightly
(``TIGHT_TOL``, from z = 0). The guess gets ``UPDATES_PER_BATCH`` updates on each token's
distance to its fixed point relative to the fixed point's norm (the paper's initial-guess
loss); half the tokens see the previous token's fixed point, half a zero vector in its
place, since a simultaneous solve does not know it yet and a sequential one does. The
mixing then runs ``MIXING_PASSES`` steps of learned Anderson on the batch's simultaneous map
and on a few of its tokens' sequential maps (from z = 0 on even batches, from the guess on
odd ones) and gets one update on the mean over those steps of the log relative residual
|f(x) - x| / |f(x)| at each iterate x it proposed: what the stop test reads (the paper's
per-step loss, the distance to z*, is ``mixing_loss="distance"``: tried here, it cut that
distance and cost passes). Each step's residual loss reads that step's mixing through one
pass of the map, which the solve's next evaluation reuses; the iterate is handed on detached.

The output is a new checkpoint folder: the model as it was, both networks beside its weights
and, per mode, where the solve starts and which solver mixes its steps, chosen on a held-out
batch (``choose_per_mode``): the fastest configuration among those that led no token to
another fixed point than the model's own solver from z = 0 (a map may have several, and
the model's answers are those of the one z = 0 leads to; word problems are also checked on
words 16 times their training length) and left no more solves above the tolerance. ``learned_solver.json`` records the fit and that comparison.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..core.atomic_io import staged_directory, write_json
from ..core.devices import usable_device
from ..core.errors import DataError, OptionError
from ..core.memory import activation_bytes, require
from ..core.run_folder import TRAINER_META, model_folder, read_trainer_meta
from ..core.targets import TargetExistsError, exclusive_target
from ..core.weights_digest import weights_sha256
from ..deq import InitialGuess, LearnedMixing
from ..deq.anderson import MEMORY, safeguarded_anderson
from ..models import load_model
from ..models.convert import MODEL_FOLDER
from ..tasks import TRAINING_BATCHES
from .config import TrainConfig
from .model_card import write_model_card
from .solver_progress import PROGRESS_EVERY, FitState, discard_progress, progress_folder, restore_progress, save_progress
from .trainer import checkpoint_config

LOGGER = logging.getLogger("implicitlm")

TIGHT_TOL = 1e-4  # the fixed points the solver learns: well below any inference tolerance in use
TIGHT_MAX_ITER = 400
# Updates of the guess per batch solved: a tight solve costs a dozen passes of the model, an
# update of the guess a small fraction of one.
UPDATES_PER_BATCH = 8
# Steps of learned Anderson per batch for the mixing's update: about as many as a solve to
# the inference tolerances in use takes.
MIXING_PASSES = 10
# Sequences of each batch whose simultaneous solve the mixing learns from (a step there costs
# a pass over the whole sequence and its backward), and tokens per batch whose sequential-mode
# solves it also learns from (a step there, one token's).
MIXING_SEQUENCES = 1
TOKEN_POSITIONS = 4
RECORD = "learned_solver.json"
# A token's logits this far (relative) from those of the model's own solve from z = 0 went
# to another fixed point; a solve to the same one, at the tolerances in use, moves them by a
# few percent.
MOVED = 0.25
MODES = ("simultaneous", "sequential")
# What each learned step is fitted to minimise: "residual", the log relative residual
# |f(x) - x| / |f(x)| at the iterate x it proposed (what the stop test reads); "distance", the
# paper's, |x - z*| / |z*| (on the WikiText-2 model it cut that distance and cost passes:
# 9.88 per held-out sequence against 8.94).
MIXING_LOSSES = ("residual", "distance")
# (start, solver) per mode; "own" is the checkpoint's solver for the mode.
CONFIGURATIONS = (("zero", "own"), ("learned", "own"), ("zero", "learned_anderson"), ("learned", "learned_anderson"))
DEFAULT_SEQUENCE_LENGTH = 256
# Word problems are also checked for another fixed point at this multiple of the training
# length, the longest the handbook evaluates: on the S3 model a guess reached the fixed points
# of z = 0 at 1x-4x and moved a few words' at 8x and 16x.
LONGER_MULTIPLE = 16
LONGER_COUNT = 256  # the handbook's --count: one word in 256 reached another fixed point at 8x-16x
# Bytes of a token id in a batch: int64, as torch embeds it.
INPUT_BYTES = 8
TIMED_RUNS = 2  # per configuration on the held-out batch; the faster is kept
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
    ``resume``: continue the fit an interruption left (``solver_progress``).
    ``guess_reads_state``: the guess also reads each block's recurrent state before the token
    (``deq.InitialGuess``'s ``readouts``), not only the previous fixed point.
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
        batches = TRAINING_BATCHES[config.task].from_path(config, data)
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
        record["chosen"] = {mode: {"initial_guess": start, "solver": _solver_name(solver, own, mode)}
                            for mode, (start, solver) in
                            choose_per_mode(record["held_out"], record["mixing_improved"]).items()}
        model.set_fixed_point_options(initial_guess="zero", **{
            f"{mode}_{key}": value for mode, chosen in record["chosen"].items() for key, value in chosen.items()})
        _save(out, checkpoint, model, record)
        discard_progress(progress_folder(out))
    return record


def _own_solvers(model) -> dict[str, str]:
    """The checkpoint's solver per mode, the learned mixing's base where it had one already."""
    options = model.solver.options
    return {mode: "safeguarded_anderson" if options.solver_for(mode) == "learned_anderson" else options.solver_for(mode)
            for mode in MODES}


def _solver_name(solver: str, own: dict[str, str], mode: str) -> str:
    """A ``CONFIGURATIONS`` solver as the options name it: "own" is the checkpoint's for ``mode``."""
    return own[mode] if solver == "own" else solver


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


def mixing_improved(loss: dict[str, float], mixing_loss: str) -> bool:
    """Whether the mixing's fit lowered its loss (``loss``: its first update's and the mean of
    its last ones, as the record keeps them). A fit that raised it is said in a warning line,
    and its mixing, saved all the same, is chosen for no mode (``choose_per_mode``)."""
    if loss["last"] <= loss["first"]:
        return True
    LOGGER.warning(f"learned mixing: its fit raised the mean {mixing_loss} loss over its steps ({loss['first']:.2f} -> "
                   f"{loss['last']:.2f}); saved, but not used (solver learned_anderson still picks it)")
    return False


def choose_per_mode(held_out: dict[str, dict[str, dict[str, float]]],
                    use_mixing: bool = True) -> dict[str, tuple[str, str]]:
    """Per mode, the (initial_guess, solver) that ran the held-out batch fastest among those
    that led no token to another fixed point than the own solver from z = 0 (nor, for word
    problems, any token of the long words) and left no larger share of solves above the
    tolerance; without ``use_mixing`` (a fit that made it worse), those of the own solver
    only. Time, not passes: a pass of the learned mixing
    costs more than one of the least-squares step (a few dozen small operations more, which a
    token step at batch 1 notices), so fewer passes may still be slower."""
    chosen = {}
    for mode in MODES:
        measured = held_out[mode]
        baseline = measured[_name(*CONFIGURATIONS[0])]
        allowed = [configuration for configuration in CONFIGURATIONS
                   if (use_mixing or configuration[1] == "own")
                   and measured[_name(*configuration)]["moved_share"] == 0
                   and measured[_name(*configuration)].get("moved_share_long", 0) == 0
                   and measured[_name(*configuration)]["unconverged_share"] <= baseline["unconverged_share"]]
        chosen[mode] = min(allowed, key=lambda configuration: measured[_name(*configuration)]["seconds"])
    return chosen


def _name(start: str, solver: str) -> str:
    return f"{start}+{solver}"


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
        _fit_guess(guess, fitted["guess"][1], embedded, z_star, reader, state, settings)
        # From z = 0 on even batches, from the guess on odd ones: the mixing serves both starts.
        _fit_mixing(model, mixing, fitted["mixing"][1], inputs, z_star, None if batch % 2 == 0 else guess, state,
                    settings)
        state.batches_done += 1
        if state.batches_done % PROGRESS_EVERY == 0 and state.batches_done < steps:
            save_progress(kept, settings, state, fitted, batches)
    return state


def _fit_guess(guess: InitialGuess, optimizer, embedded: torch.Tensor, z_star: torch.Tensor, reader, state: FitState,
               settings: dict[str, Any]) -> None:
    """``reader``: the batch's ``state_reader`` for a guess that reads the state (else None);
    a token whose previous fixed point is hidden has its state hidden too, as in a
    simultaneous solve."""
    previous = torch.cat([torch.zeros_like(z_star[:, :1]), z_star[:, :-1]], dim=1)
    for _ in range(UPDATES_PER_BATCH):
        update = len(state.losses["guess"])
        draw = torch.Generator().manual_seed(settings["seed"] * 1_000_003 + update)
        known = (torch.rand(z_star.shape[:2], generator=draw) < 0.5).to(z_star.device)
        _decay(optimizer, settings["lr"], update, settings["steps"] * UPDATES_PER_BATCH)
        shown = known.unsqueeze(-1)
        read = None if reader is None else (lambda queries: [read * shown for read in reader(queries)])
        loss = _relative_distance(guess(embedded, previous * shown, read), z_star).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        state.losses["guess"].append(loss.item())


def _fit_mixing(model, mixing: LearnedMixing, optimizer, inputs: torch.Tensor, z_star: torch.Tensor,
                guess: InitialGuess | None, state: FitState, settings: dict[str, Any]) -> None:
    """One update of the mixing on learned-Anderson runs of ``MIXING_PASSES`` steps, in both
    modes' maps: ``MIXING_SEQUENCES`` whole sequences', and ``TOKEN_POSITIONS`` tokens' maps (each from the
    state its predecessors' fixed points left), from ``guess`` or (None) from z = 0. Each
    step's loss is back-propagated as it comes (the next step reads the iterate detached).
    ``z_star``: the batch's fixed points, which the token maps' states are read off."""
    update = len(state.losses["mixing"])
    _decay(optimizer, settings["lr"], update, settings["steps"])
    optimizer.zero_grad(set_to_none=True)
    draw = torch.Generator().manual_seed(settings["seed"] * 1_000_003 + update)
    positions = sorted(torch.randperm(inputs.shape[1], generator=draw)[:TOKEN_POSITIONS].tolist())
    runs = 1 + len(positions)
    per_step = []

    def fit_run(f, start: torch.Tensor, target: torch.Tensor) -> None:
        reused = _ReusedEvaluation(f)

        def step_loss(proposed: torch.Tensor) -> None:
            if settings["mixing_loss"] == "distance":
                loss = _relative_distance(proposed.flatten(1), target.flatten(1)).mean()
            else:
                loss = reused.relative_residual(proposed).clamp_min(1e-8).log().mean()
            (loss / (MIXING_PASSES * runs)).backward()
            per_step.append(loss.item())

        safeguarded_anderson(reused, start, MIXING_PASSES, mixing=mixing, on_proposed=step_loss)

    with model.fixed_point_map(inputs[:MIXING_SEQUENCES]) as (embedded, f):
        fit_run(f, torch.zeros_like(embedded) if guess is None else guess(embedded).detach(),
                z_star[:MIXING_SEQUENCES])
    with model.token_maps(inputs, z_star, positions) as maps:
        for t, (embedded_t, f_t, read_t) in zip(positions, maps):
            previous = z_star[:, t - 1] if t > 0 else None
            start = torch.zeros_like(z_star[:, t]) if guess is None else guess(embedded_t, previous, read_t).detach()
            fit_run(f_t, start, z_star[:, t])
    optimizer.step()
    state.losses["mixing"].append(sum(per_step) / len(per_step))


class _ReusedEvaluation:
    """The map as the solver sees it during a fit, where each learned step's loss evaluates
    the map at the step's iterate with autograd on (the relative residual there, in the
    iterate's gradient): the solver's next evaluation, at that iterate detached, is the one
    the loss made, not a second pass."""

    def __init__(self, f) -> None:
        self.f, self.kept = f, None

    def relative_residual(self, iterate: torch.Tensor) -> torch.Tensor:
        """Each sample's |f(x) - x| / |f(x)| at ``iterate``, with the graph through f."""
        with torch.enable_grad():
            image = self.f(iterate)
        self.kept = (iterate.detach(), image.detach())
        step = (image - iterate).float().flatten(1).norm(dim=1)
        return step / (image.float().flatten(1).norm(dim=1) + 1e-9)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        if self.kept is not None and torch.equal(z, self.kept[0]):
            return self.kept[1]
        return self.f(z)


def _decay(optimizer, lr: float, update: int, updates: int) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * update / updates))


def _relative_distance(iterate: torch.Tensor, z_star: torch.Tensor) -> torch.Tensor:
    """Each token's distance to its fixed point over the fixed point's norm."""
    return (iterate.float() - z_star.float()).norm(dim=-1) / (z_star.float().norm(dim=-1) + 1e-6)


def compare_configurations(model, own: dict[str, str], inputs: torch.Tensor,
                           longer: torch.Tensor | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Per mode and (start, solver) of ``CONFIGURATIONS``, on the held-out batch as each mode
    serves (simultaneous: the whole batch, as scoring runs; sequential: its first sequence
    alone, as ``generate()`` decodes one): the seconds of the forward (the faster of
    ``TIMED_RUNS``), the mean passes of the map per solve (per sequence; per token) at the
    model's own inference budget, the share of solves above the tolerance, and the share of
    tokens whose logits ``MOVED`` from those of the own solver from z = 0 (another fixed
    point); with ``longer``, that share on them too (``moved_share_long``)."""
    measured: dict[str, dict[str, dict[str, float]]] = {mode: {} for mode in MODES}
    for mode in MODES:
        rows = inputs if mode == "simultaneous" else inputs[:1]
        reference, longer_reference = None, None
        for start, solver in CONFIGURATIONS:
            model.set_fixed_point_options(**{f"{mode}_initial_guess": start,
                                             f"{mode}_solver": _solver_name(solver, own, mode)})
            seconds = []
            for _ in range(TIMED_RUNS):
                began = time.perf_counter()
                with torch.no_grad():  # solved to the tolerance, whatever passes the checkpoint declares
                    output = model(rows, mode=mode, passes=0)
                seconds.append(time.perf_counter() - began)
            reference = output.logits if reference is None else reference
            measured[mode][_name(start, solver)] = {
                "seconds": round(min(seconds), 4),
                "passes": round(output.fixed_point.iterations.float().mean().item(), 3),
                "unconverged_share": round((~output.fixed_point.converged).float().mean().item(), 4),
                "moved_share": _moved_share(output.logits, reference),
            }
            if longer is not None:
                with torch.no_grad():
                    logits = model(longer, mode=mode, passes=0).logits
                longer_reference = logits if longer_reference is None else longer_reference
                measured[mode][_name(start, solver)]["moved_share_long"] = _moved_share(logits, longer_reference)
    return measured


def _moved_share(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """The share of tokens whose logits are ``MOVED`` (relative) from ``reference``'s."""
    logits, reference = logits.float(), reference.float()
    moved = (logits - reference).norm(dim=-1) > MOVED * reference.norm(dim=-1)
    return round(moved.float().mean().item(), 4)
