"""A small network of a learned solver (initial guess, mixing), saved beside a checkpoint's
weights as ``NAME.safetensors`` with its SHA-256 in ``NAME.safetensors.sha256``. Loading
reads no pickle, checks the digest and every tensor's shape, and says what is wrong in one
line (``DataError``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..core.atomic_io import atomic_write
from ..core.errors import DataError
from ..core.weights_digest import file_sha256


def save_network(network: nn.Module, folder: str | Path, file: str, metadata: dict[str, str]) -> None:
    """``file`` and its digest in ``folder``, each written whole or not at all."""
    folder = Path(folder)
    tensors = {name: tensor.detach().float().contiguous().cpu() for name, tensor in network.state_dict().items()}
    atomic_write(folder / file, lambda temporary: save_file(tensors, str(temporary), metadata=metadata))
    digest = file_sha256(folder / file)
    atomic_write(folder / f"{file}.sha256", lambda temporary: temporary.write_text(digest + "\n"))


def load_network(folder: str | Path, file: str, build: Callable[[dict[str, torch.Tensor]], nn.Module],
                 needed_by: str) -> nn.Module:
    """The network saved as ``file`` in ``folder``, made by ``build(tensors)`` (which reads
    any size it needs off them) and filled with them, in evaluation mode and frozen.
    ``needed_by``: what asks for the file, named when it is missing."""
    path = Path(folder) / file
    if not path.is_file():
        raise DataError(f"{path}: missing, but {needed_by}")
    digest_file = Path(folder) / f"{file}.sha256"
    if not digest_file.is_file():
        raise DataError(f"{digest_file}: missing; {file} is not loaded unchecked")
    if file_sha256(path) != digest_file.read_text(encoding="utf-8", errors="replace").strip().lower():
        raise DataError(f"{path}: SHA-256 differs from {digest_file.name}: the file is damaged")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise DataError(f"{path}: not a safetensors file ({str(error).splitlines()[0]})") from None
    for name, tensor in tensors.items():
        _check_tensor(path, name, tensor)
    network = build(tensors)
    expected = {name: tuple(tensor.shape) for name, tensor in network.state_dict().items()}
    found = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    if found != expected:
        raise DataError(f"{path}: tensors {json.dumps(found)}, but a model of these sizes needs {json.dumps(expected)}")
    network.load_state_dict(tensors)
    return network.eval().requires_grad_(False)


def _check_tensor(path: Path, name: str, tensor: torch.Tensor) -> None:
    """A tensor of a learned solver's file, as ``save_network`` writes them: float32 weights of
    one or more dimensions, finite. A NaN mixing would only be caught, if at all, solve by solve."""
    if tensor.dtype != torch.float32:
        raise DataError(f"{path}: tensor {name} is {str(tensor.dtype).removeprefix('torch.')}; "
                        f"a learned solver's tensors are float32")
    if tensor.dim() == 0:
        raise DataError(f"{path}: tensor {name} is a scalar (0-d); a learned solver's tensors are weight matrices and vectors")
    if not bool(torch.isfinite(tensor).all()):
        raise DataError(f"{path}: tensor {name} holds NaN or Inf")
