"""Checkpoints: safetensors weights + config, and the optimiser/scheduler state, written atomically.

A checkpoint is a directory. It is assembled under a temporary name beside its final
place and renamed into it, so a crash leaves either the previous checkpoint or the new
one, never a mixture; a write that fails (a full disk) is one ``WriteError``
naming the checkpoint and the system's reason. Training state is loaded with
``weights_only=True``: nothing in a checkpoint directory is unpickled into arbitrary objects
or executed. A resume goes on only where the step agrees in the folder's name, the metadata,
the scheduler and the optimiser.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.atomic_io import recover_replaced, staged_directory, writing
from ..core.migrations import former_word_training_state
from ..core.errors import DataError
from ..core.run_folder import (
    CHECKPOINTS, STAGE_KEYS, TRAINER_META, latest_checkpoint, model_folder, read_trainer_meta,
    step_directories, step_in_name,
)
from ..models import ImplicitCausalLM, load_model
from ..models.learned_solver import without_learned_solver
from .model_card import MODEL_CARD, write_model_card
from .run_log import stopped_before_first_checkpoint

TRAINING_STATE = "training_state.pt"


class CheckpointError(DataError):
    """A checkpoint directory that is missing, incomplete, corrupt or inconsistent."""


def save_checkpoint(
    path: str | Path,
    model,
    training_state: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    tokenizer=None,
) -> Path:
    """``training_state``: tensors and plain containers only (optimiser, scheduler, sampler,
    RNG state), loadable without unpickling objects. ``weights``: the state dict to save
    when the model's own is not the full one (gathered from FSDP shards). ``tokenizer``:
    saved beside the model, so that the checkpoint alone can be evaluated on text. A model
    card (``README.md``) says what the model is and how to load it."""
    path = Path(path)
    with staged_directory(path) as staging:
        # The tokenizer first: the model's save records its files' digests with the config's.
        if tokenizer is not None:
            with writing(path, "the tokenizer"):
                tokenizer.save_pretrained(staging)
        with writing(path, "model.safetensors"):
            model.save_pretrained(staging, safe_serialization=True, state_dict=weights)
        if training_state is not None:
            # Through a Python file, whose failed write raises the OSError that says why;
            # torch's own writer reports only "iostream error".
            with writing(path, TRAINING_STATE), open(staging / TRAINING_STATE, "wb") as file:
                torch.save(training_state, file)
        with writing(path, TRAINER_META):
            (staging / TRAINER_META).write_text(json.dumps(meta or {}, indent=2))
        with writing(path, MODEL_CARD):
            write_model_card(staging, model, meta or {})
    return path


def run_checkpoint(run_dir: Path) -> Path:
    """The latest checkpoint of the run in ``run_dir``, to resume from."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        stopped = stopped_before_first_checkpoint(run_dir)
        if stopped:
            raise CheckpointError(stopped, arguments=("overwrite",))
        raise CheckpointError(f"{run_dir}: nothing to resume (no checkpoint in {run_dir / CHECKPOINTS})")
    return checkpoint


def prune_checkpoints(folder: str | Path, keep: int) -> None:
    """Delete all but the ``keep`` latest checkpoints in ``folder``."""
    for old in step_directories(Path(folder))[:-keep]:
        shutil.rmtree(old)


def load_training_state(path: str | Path) -> dict[str, Any]:
    file = Path(path) / TRAINING_STATE
    if not file.is_file():
        raise CheckpointError(f"{path}: no {TRAINING_STATE} (not a training checkpoint)")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for truncated/corrupt files
        raise CheckpointError(f"{file}: unreadable training state ({type(error).__name__})") from None


@contextlib.contextmanager
def applying_training_state(checkpoint: Path, step: int, optimizer: torch.optim.Optimizer, scheduler):
    """Around handing a loaded training state to the optimiser, scheduler, sampler and RNG:
    a state that unpickled safely but does not fit them is a damaged checkpoint. The
    optimiser takes moments of any shape without a word and fails at its first step, so
    their shapes are checked against the parameters here. The state must be ``step``'s."""
    try:
        yield
        _check_moments_fit(optimizer)
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(f"{checkpoint / TRAINING_STATE}: does not fit this run ({message})") from None
    _check_state_step(checkpoint, step, optimizer, scheduler)


def _check_state_step(checkpoint: Path, step: int, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Another step's state would go on at that step's learning rate and with its moments.
    A parameter without a gradient in some step is not stepped, so the optimiser's count is
    that of the parameters stepped most."""
    file, said = checkpoint / TRAINING_STATE, f"but {TRAINER_META} says step {step}"
    if scheduler.last_epoch != step:
        raise CheckpointError(f"{file}: the scheduler's state is at step {scheduler.last_epoch}, {said}")
    counts = [float(state["step"]) for state in optimizer.state.values() if "step" in state]
    if counts and max(counts) != step:
        raise CheckpointError(f"{file}: the optimiser's state has taken {max(counts):g} steps, {said}")


def _check_moments_fit(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            for name, value in optimizer.state.get(param, {}).items():
                if torch.is_tensor(value) and value.dim() > 0 and value.shape != param.shape:
                    raise DataError(f"optimiser state {name!r} of shape {tuple(value.shape)} for a parameter of shape {tuple(param.shape)}")


def restore_weights(model, checkpoint: Path, state_keys: tuple[str, ...]) -> tuple[int, dict[str, Any]]:
    """Load ``checkpoint``'s weights into ``model``; returns its step and training state,
    which must hold ``state_keys``.

    The checkpoint must hold the same architecture; the solver options, which the
    curriculum changes from phase to phase, may differ."""
    recover_replaced(checkpoint)
    saved = load_model(checkpoint)
    if _architecture(saved.config) != _architecture(model.config):
        raise CheckpointError(f"{checkpoint}: saved for another model configuration than this run's")
    step = read_trainer_meta(checkpoint).get("step")  # of its type, if there, as every read checks it
    if step is None:
        raise CheckpointError(f"{checkpoint / TRAINER_META}: expected the step count in 'step', got none")
    if step_in_name(checkpoint) not in (None, step):
        folder = checkpoint.name
        raise CheckpointError(f"{checkpoint / TRAINER_META}: step {step}, but the checkpoint's folder is {folder}")
    state = former_word_training_state(checkpoint, load_training_state(checkpoint), step)
    missing = [key for key in state_keys if not isinstance(state, dict) or key not in state]
    if missing:
        raise CheckpointError(f"{checkpoint / TRAINING_STATE}: expected {', '.join(missing)} in the training state")
    model.load_state_dict(saved.state_dict())
    return step, state


# What saving adds to a config (and the solver options) do not make another architecture.
_NOT_ARCHITECTURE = ("fixed_point", "transformers_version", "architectures", "dtype")


def _architecture(config) -> dict[str, Any]:
    return {k: v for k, v in config.to_diff_dict().items() if k not in _NOT_ARCHITECTURE}


def saved_settings(checkpoint: Path) -> dict[str, Any]:
    """The training settings a checkpoint records (its metadata's "train" section), in today's spelling."""
    settings = read_trainer_meta(checkpoint).get("train")
    if not isinstance(settings, dict):
        raise CheckpointError(f"{checkpoint / TRAINER_META}: expected the training settings in 'train', got {settings!r}")
    return settings


# What a run's checkpoints carry of where their model began, a resume included.
RUN_HISTORY = ("initialised_from", "lineage")


@dataclass(frozen=True)
class WarmStart:
    """Where a new run's weights came from: a checkpoint (or a run's latest), the batch
    position its run had reached (None for a model saved without training state), and the
    stages of training its model went through, its own last (none for a model without
    training metadata: imported or built)."""

    checkpoint: Path
    data_position: dict[str, Any] | None
    lineage: list[dict[str, Any]]

    def history(self) -> dict[str, Any]:
        """What the new run's checkpoints record of where their model began."""
        return {"initialised_from": str(self.checkpoint), **({"lineage": self.lineage} if self.lineage else {})}


def warm_start(model: ImplicitCausalLM, source: str | Path) -> WarmStart:
    """``model`` initialised from the weights at ``source`` (``models.convert.initialise_from``:
    explicit to implicit included); returns where they came from."""
    # Imported here: convert imports transformers' model classes, a second's start-up that
    # every command would pay (the trainer is imported by the command line's error handling).
    from ..models.convert import initialise_from

    checkpoint = model_folder(source)
    source_model = load_model(checkpoint)
    initialise_from(model, source_model)
    if model.config.implicit:  # the source's learned solver was fitted to its weights, not this run's
        model.set_fixed_point_options(**without_learned_solver(model.solver.options))
    position = load_training_state(checkpoint).get("sampler") if (checkpoint / TRAINING_STATE).is_file() else None
    return WarmStart(checkpoint, position, _lineage(checkpoint, source_model.config.implicit))


def _lineage(checkpoint: Path, implicit: bool) -> list[dict[str, Any]]:
    """The stages of the model at ``checkpoint``: those its metadata records, then its own."""
    meta = read_trainer_meta(checkpoint) if (checkpoint / TRAINER_META).is_file() else {}
    if "step" not in meta or "train" not in meta:
        return []
    own = {key: meta[key] for key in STAGE_KEYS if key in meta}
    return [*meta.get("lineage", []), {**own, "implicit": implicit}]
