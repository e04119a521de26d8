"""A learned first iterate for the fixed-point solves of a trained model (Bai, Koltun and
Kolter, *Neural Deep Equilibrium Solvers*, ICLR 2022: the initialiser half).

A solve from z = 0 spends its first passes finding the neighbourhood of z*. A small network
reads what the solve is given, each token's input (its embedding, of which the injection u_t
is a linear function, at a fraction of u_t's width) and (in sequential mode) the previous
token's fixed point z*_{t-1}, and proposes z0 near z*_t; the solve then runs as before from
there. The stop test is the same, so the tolerance keeps its meaning. But a map may have
several fixed points, and a trained model's answers are those of the one z = 0 leads to: a
poor guess may lead elsewhere, which is why ``implicitlm solver train`` checks a held-out
batch before it lets a guess be used (``train.learned_guess.modes_it_serves``).

In simultaneous mode the previous tokens' fixed points are unknown when the solve starts:
the network reads a zero vector in their place, and it is trained on both kinds of input.

Saved beside a checkpoint's weights as ``initial_guess.safetensors`` with its SHA-256 in
``initial_guess.safetensors.sha256``; the checkpoint's ``fixed_point.initial_guess`` says
"learned". Loading reads no pickle and checks the digest and every tensor's shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..core.atomic_io import atomic_write
from ..core.errors import DataError
from ..core.weights_digest import file_sha256

GUESS_FILE = "initial_guess.safetensors"
GUESS_DIGEST = f"{GUESS_FILE}.sha256"
WIDTH = 128  # hidden units: 98k parameters beside the shipped 1-layer WikiText-2 model's 1.6M


class InitialGuess(nn.Module):
    """z0 = W2 gelu(W1 [rms(x_t), rms(z_prev)]), computed in float32 whatever the model's dtype."""

    def __init__(self, hidden_size: int, width: int = WIDTH) -> None:
        super().__init__()
        self.hidden_size, self.width = hidden_size, width
        self.hidden = nn.Linear(2 * hidden_size, width)
        self.out = nn.Linear(width, hidden_size)

    def forward(self, embedded: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
        """``embedded``: (..., hidden_size), the tokens' embeddings; ``previous``: the previous
        token's fixed point, or None where it is not known yet (a simultaneous solve)."""
        x = _rms(embedded.float())
        z = torch.zeros_like(x) if previous is None else _rms(previous.float())
        return self.out(nn.functional.gelu(self.hidden(torch.cat([x, z], dim=-1)))).to(embedded.dtype)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(tensor.shape) for name, tensor in self.state_dict().items()}

    def save(self, folder: str | Path) -> None:
        """``GUESS_FILE`` and its digest in ``folder``, each written whole or not at all."""
        folder = Path(folder)
        metadata = {"hidden_size": str(self.hidden_size), "width": str(self.width)}
        tensors = {name: tensor.detach().float().contiguous().cpu() for name, tensor in self.state_dict().items()}
        atomic_write(folder / GUESS_FILE, lambda temporary: save_file(tensors, str(temporary), metadata=metadata))
        digest = file_sha256(folder / GUESS_FILE)
        atomic_write(folder / GUESS_DIGEST, lambda temporary: temporary.write_text(digest + "\n"))

    @classmethod
    def load(cls, folder: str | Path, hidden_size: int) -> InitialGuess:
        """The guess saved in ``folder`` for a model of these sizes; a missing, damaged or
        mismatched file is a one-line DataError."""
        path = Path(folder) / GUESS_FILE
        if not path.is_file():
            raise DataError(f"{path}: missing, but the config's fixed_point.initial_guess is 'learned'")
        digest_file = Path(folder) / GUESS_DIGEST
        if not digest_file.is_file():
            raise DataError(f"{digest_file}: missing; the learned initial guess is not loaded unchecked")
        if file_sha256(path) != digest_file.read_text(encoding="utf-8", errors="replace").strip().lower():
            raise DataError(f"{path}: SHA-256 differs from {GUESS_DIGEST}: the file is damaged")
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as error:
            raise DataError(f"{path}: not a safetensors file ({str(error).splitlines()[0]})") from None
        width = tensors["hidden.weight"].shape[0] if "hidden.weight" in tensors else WIDTH
        guess = cls(hidden_size, width)
        expected = guess.shapes()
        found = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
        if found != expected:
            raise DataError(f"{path}: tensors {json.dumps(found)}, but a model of these sizes needs {json.dumps(expected)}")
        guess.load_state_dict(tensors)
        return guess.eval().requires_grad_(False)


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
