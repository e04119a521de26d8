"""A learned first iterate for the fixed-point solves of a trained model (Bai, Koltun and
Kolter, *Neural Deep Equilibrium Solvers*, ICLR 2022: the initialiser half).

A solve from z = 0 spends its first passes finding the neighbourhood of z*. A small network
reads what the solve is given, each token's input (its embedding, of which the injection u_t
is a linear function, at a fraction of u_t's width) and (in sequential mode) the previous
token's fixed point z*_{t-1}, and proposes z0 near z*_t; the solve then runs as before from
there. The stop test is the same, so the tolerance keeps its meaning. But a map may have
several fixed points, and a trained model's answers are those of the one z = 0 leads to: a
poor guess may lead elsewhere, which is why ``implicitlm solver train`` checks a held-out
batch before it lets a guess be used (``train.solver_comparison.choose_per_mode``).

In simultaneous mode the previous tokens' fixed points are unknown when the solve starts
(but for a chunk's first token, whose predecessor the chunk before settled): the network
reads a zero vector in their place, and it is trained on both kinds of input.

The previous fixed point carries what the tokens before it left in the recurrent state only
as far as the last token's answer needed it. A guess built with ``readouts`` also reads the
state itself, through a learned query per block (``implicitlm solver train
--guess-reads-state``); where the state is unknown (a simultaneous solve's tokens but a
chunk's first), it reads zeros, as for the previous fixed point.

Saved beside a checkpoint's weights as ``initial_guess.safetensors`` with its SHA-256 in
``initial_guess.safetensors.sha256``; the checkpoint's ``fixed_point.initial_guess`` says
"learned". Loading reads no pickle and checks the digest and every tensor's shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from .saved_network import load_network, save_network

GUESS_FILE = "initial_guess.safetensors"
GUESS_DIGEST = f"{GUESS_FILE}.sha256"
WIDTH = 128  # hidden units: 98k parameters beside the shipped 1-layer WikiText-2 model's 1.6M
ReadState = Callable[[list[torch.Tensor]], list[torch.Tensor]]


class InitialGuess(nn.Module):
    """z0 = W2 gelu(W1 [rms(x_t), rms(z_prev), rms(r_1), ...]), computed in float32 whatever
    the model's dtype. With ``readouts`` (per block of the model, the (query, readout) widths
    of its ``read_state``), the guess also reads the recurrent state before the token: per
    block, a query q_l = Q_l [rms(x_t), rms(z_prev)] read against the block's state gives
    r_l (for an SSM, the state read as its C reads it; for attention, the cache attended to)."""

    def __init__(self, hidden_size: int, width: int = WIDTH, readouts: Sequence[tuple[int, int]] = ()) -> None:
        super().__init__()
        self.hidden_size, self.width = hidden_size, width
        self.readouts = tuple((int(query), int(readout)) for query, readout in readouts)
        self.queries = nn.ModuleList(nn.Linear(2 * hidden_size, query) for query, _ in self.readouts)
        self.hidden = nn.Linear(2 * hidden_size + sum(readout for _, readout in self.readouts), width)
        self.out = nn.Linear(width, hidden_size)

    @property
    def reads_state(self) -> bool:
        return bool(self.readouts)

    def forward(self, embedded: torch.Tensor, previous: torch.Tensor | None = None,
                read_state: ReadState | None = None) -> torch.Tensor:
        """``embedded``: (..., hidden_size), the tokens' embeddings; ``previous``: the previous
        token's fixed point, or None where it is not known yet (a simultaneous solve);
        ``read_state``: per-block queries (..., query width) -> per-block readouts of the state
        before the tokens (``BlockStack.read_state``), or None where it is not known."""
        x = _rms(embedded.float())
        z = torch.zeros_like(x) if previous is None else _rms(previous.float())
        features = [x, z]
        if self.reads_state:
            features += self._read(torch.cat(features, dim=-1), read_state)
        return self.out(nn.functional.gelu(self.hidden(torch.cat(features, dim=-1)))).to(embedded.dtype)

    def _read(self, known: torch.Tensor, read_state: ReadState | None) -> list[torch.Tensor]:
        if read_state is None:
            return [known.new_zeros(*known.shape[:-1], readout) for _, readout in self.readouts]
        return [_rms(read.float()) for read in read_state([query(known) for query in self.queries])]

    def save(self, folder: str | Path) -> None:
        """``GUESS_FILE`` and its digest in ``folder``."""
        save_network(self, folder, GUESS_FILE, {"hidden_size": str(self.hidden_size), "width": str(self.width),
                                                 "readouts": json.dumps(self.readouts)})

    @classmethod
    def load(cls, folder: str | Path, hidden_size: int, readouts: Sequence[tuple[int, int]] = ()) -> InitialGuess:
        """The guess saved in ``folder`` for a model of these sizes (``readouts``: the model's
        ``BlockStack.readout_sizes()``, for a guess that reads the state); a missing, damaged
        or mismatched file is a one-line DataError."""
        def build(tensors: dict[str, torch.Tensor]) -> InitialGuess:
            width = tensors["hidden.weight"].shape[0] if "hidden.weight" in tensors else WIDTH
            reads_state = any(name.startswith("queries.") for name in tensors)
            return cls(hidden_size, width, readouts if reads_state else ())

        return load_network(folder, GUESS_FILE, build, "the config's fixed_point.initial_guess is 'learned'")


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
