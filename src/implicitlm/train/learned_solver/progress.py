"""Where a fit of a learned solver (``fit.train_learned_solver``) stands, kept
beside its target every ``PROGRESS_EVERY`` batches so that an interrupted fit continues
(``resume=True``) exactly where it stopped: each network (the guess, the mixing), its
AdamW moments, the batches' position and the losses so far. A resume checks that it
continues the same fit (source weights, data, sizes, seed) and refuses another in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ...core.atomic_io import atomic_write, remove_entry, staged_directory, write_json
from ...core.errors import DataError
from ...core.json_file import read_json_object

PROGRESS_EVERY = 10  # batches between two saves of the progress
TENSORS, META = "progress.safetensors", "progress.json"
MOMENTS = ("step", "exp_avg", "exp_avg_sq")  # AdamW's state per parameter
# name -> (the network, its optimiser)
Fitted = dict[str, tuple[nn.Module, torch.optim.Optimizer]]


@dataclasses.dataclass
class FitState:
    batches_done: int = 0
    losses: dict[str, list[float]] = dataclasses.field(default_factory=lambda: {"guess": [], "mixing": []})
    missed: int = 0  # tight solves that stopped above the tolerance
    solved: int = 0


def progress_folder(out: str | Path) -> Path:
    out = Path(out).absolute()
    return out.with_name(f".{out.name}.solver-progress")


def save_progress(folder: Path, settings: dict[str, Any], state: FitState, fitted: Fitted, batches) -> None:
    tensors = {}
    for name, (network, optimizer) in fitted.items():
        tensors.update({f"{name}.{key}": tensor.detach().clone() for key, tensor in network.state_dict().items()})
        for index, parameter in enumerate(network.parameters()):
            for moment, value in optimizer.state.get(parameter, {}).items():
                tensors[f"adam.{name}.{index}.{moment}"] = torch.as_tensor(value).detach().clone()
    with staged_directory(folder) as staging:
        atomic_write(staging / TENSORS, lambda temporary: save_file(tensors, str(temporary)))
        write_json(staging / META, {"settings": settings, "state": dataclasses.asdict(state),
                                    "batches": batches.state_dict()})


def restore_progress(folder: Path, settings: dict[str, Any], fitted: Fitted, batches) -> FitState:
    """The state saved in ``folder``, loaded into the networks, their optimisers and ``batches``."""
    meta = read_json_object(folder / META, "the progress of a learned solver's fit")
    saved = meta.get("settings", {})
    differing = [key for key in settings if saved.get(key) != settings[key]]
    if differing:
        key = differing[0]
        raise DataError(f"{folder}: the interrupted fit had {key}={saved.get(key)!r}, this one {settings[key]!r}; "
                        "start again with overwrite=True", arguments=("overwrite",))
    tensors = load_file(str(folder / TENSORS))
    for name, (network, optimizer) in fitted.items():
        prefix = f"{name}."
        network.load_state_dict({key[len(prefix):]: value for key, value in tensors.items() if key.startswith(prefix)})
        for index, parameter in enumerate(network.parameters()):
            # Saved from, and read to, the CPU; AdamW keeps its step count there, its moments beside the parameter.
            moments = {moment: tensors[key] if moment == "step" else tensors[key].to(parameter.device)
                       for moment in MOMENTS if (key := f"adam.{name}.{index}.{moment}") in tensors}
            if moments:
                optimizer.state[parameter] = moments
    batches.load_state_dict(meta["batches"])
    return FitState(**meta["state"])


def discard_progress(folder: Path) -> None:
    if folder.exists():
        remove_entry(folder)
