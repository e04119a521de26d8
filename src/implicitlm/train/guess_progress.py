"""Where a fit of a learned initial guess stands (``learned_guess.train_learned_guess``), kept
beside its target every ``PROGRESS_EVERY`` batches so that an interrupted fit continues
(``resume=True``) exactly where it stopped: the guess, AdamW's moments, the batches'
position and the losses so far. A resume checks that it continues the same fit (source
weights, data, sizes, seed) and refuses another in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..core.atomic_io import remove_entry, staged_directory, write_json
from ..core.errors import DataError
from ..core.json_file import read_json_object
from ..deq import InitialGuess

PROGRESS_EVERY = 10  # batches between two saves of the progress
TENSORS, META = "progress.safetensors", "progress.json"
MOMENTS = ("step", "exp_avg", "exp_avg_sq")  # AdamW's state per parameter


@dataclasses.dataclass
class FitState:
    batches_done: int = 0
    losses: list[float] = dataclasses.field(default_factory=list)
    missed: int = 0  # tight solves that stopped above the tolerance
    solved: int = 0


def progress_folder(out: str | Path) -> Path:
    out = Path(out).absolute()
    return out.with_name(f".{out.name}.guess-progress")


def save_progress(folder: Path, settings: dict[str, Any], state: FitState, guess: InitialGuess,
                  optimizer: torch.optim.Optimizer, batches) -> None:
    tensors = {f"guess.{name}": tensor.detach().clone() for name, tensor in guess.state_dict().items()}
    for index, parameter in enumerate(guess.parameters()):
        for moment, value in optimizer.state.get(parameter, {}).items():
            tensors[f"adam.{index}.{moment}"] = torch.as_tensor(value).detach().clone()
    with staged_directory(folder) as staging:
        save_file(tensors, str(staging / TENSORS))
        write_json(staging / META, {"settings": settings, "state": dataclasses.asdict(state),
                                    "batches": batches.state_dict()})


def restore_progress(folder: Path, settings: dict[str, Any], guess: InitialGuess,
                     optimizer: torch.optim.Optimizer, batches) -> FitState:
    """The state saved in ``folder``, loaded into ``guess``, ``optimizer`` and ``batches``."""
    meta = read_json_object(folder / META, "the progress of a guess's fit")
    saved = meta.get("settings", {})
    differing = [key for key in settings if saved.get(key) != settings[key]]
    if differing:
        key = differing[0]
        raise DataError(f"{folder}: the interrupted fit had {key}={saved.get(key)!r}, this one {settings[key]!r}; "
                        "start again with overwrite=True", arguments=("overwrite",))
    tensors = load_file(str(folder / TENSORS))
    guess.load_state_dict({name[len("guess."):]: tensor for name, tensor in tensors.items() if name.startswith("guess.")})
    for index, parameter in enumerate(guess.parameters()):
        moments = {moment: tensors[f"adam.{index}.{moment}"] for moment in MOMENTS if f"adam.{index}.{moment}" in tensors}
        if moments:
            optimizer.state[parameter] = moments
    batches.load_state_dict(meta["batches"])
    return FitState(**meta["state"])


def discard_progress(folder: Path) -> None:
    if folder.exists():
        remove_entry(folder)
