"""Batches of token windows from one split of a shard directory: endless random batches for
training (``TokenSampler``), and the split once, in order, for evaluation."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from implicitlm.core.errors import DataError, OptionError
from implicitlm.data.shards import TokenShards, check_positive


class TokenSampler:
    """Endless random batches of ``(batch_size, sequence_length + 1)`` int64 token windows.

    The split is cut into non-overlapping windows of ``sequence_length + 1`` tokens; inputs
    are ``batch[:, :-1]`` and labels ``batch[:, 1:]``. Each epoch visits the windows in a
    permutation drawn from ``(seed, epoch)``, one global batch of ``batch_size * world_size``
    windows at a time; rank ``r`` gets rows ``r * batch_size`` to ``(r + 1) * batch_size - 1``
    of it, so the ranks together see exactly what one rank with the global batch size would.
    The windows left at an epoch's end, fewer than a global batch, are skipped.
    """

    def __init__(
        self,
        shards: TokenShards,
        sequence_length: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        check_positive(
            sequence_length=sequence_length, batch_size=batch_size, world_size=world_size
        )
        if not 0 <= rank < world_size:
            raise OptionError(f"rank must lie in [0, {world_size}), got {rank!r}")
        self.shards = shards
        self.sequence_length = sequence_length
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.windows = _window_count(shards, sequence_length + 1, batch_size * world_size)
        self.epoch = 0
        self.position = 0  # windows of this epoch handed out so far, over all ranks
        self._permutation_epoch = -1
        self._permutation = np.empty(0, dtype=np.int64)

    def __iter__(self) -> TokenSampler:
        return self

    def __next__(self) -> torch.Tensor:
        global_batch = self.batch_size * self.world_size
        if self.position + global_batch > self.windows:
            self.epoch += 1
            self.position = 0
        first = self.position + self.rank * self.batch_size
        window = self.sequence_length + 1
        rows = [
            self.shards.read(int(start) * window, window)
            for start in self._epoch_permutation()[first : first + self.batch_size]
        ]
        self.position += global_batch
        return torch.from_numpy(np.stack(rows).astype(np.int64))

    def state_dict(self) -> dict[str, int]:
        """Where the sampler stands, as plain JSON-able numbers, for ``load_state_dict``."""
        return {
            "epoch": self.epoch, "position": self.position, "seed": self.seed,
            "sequence_length": self.sequence_length, "windows": self.windows,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue where the sampler that gave ``state`` left off; it must match this one."""
        for key in ("seed", "sequence_length", "windows"):
            if state[key] != getattr(self, key):
                raise DataError(
                    f"sampler state has {key}={state[key]!r}, this sampler {getattr(self, key)!r}"
                )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])

    def _epoch_permutation(self) -> np.ndarray:
        if self._permutation_epoch != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._permutation = rng.permutation(self.windows)
            self._permutation_epoch = self.epoch
        return self._permutation


def evaluation_windows(
    shards: TokenShards, sequence_length: int, batch_size: int
) -> Iterator[torch.Tensor]:
    """The split once, in order, as batches of consecutive ``sequence_length + 1`` windows.

    Windows do not overlap; the last batch may be smaller, and the tokens after the last
    whole window are left out.
    """
    check_positive(sequence_length=sequence_length, batch_size=batch_size)
    window = sequence_length + 1
    windows = _window_count(shards, window, 1)
    return _consecutive_batches(shards, window, windows, batch_size)


def _consecutive_batches(
    shards: TokenShards, window: int, windows: int, batch_size: int
) -> Iterator[torch.Tensor]:
    for first in range(0, windows, batch_size):
        count = min(batch_size, windows - first)
        tokens = shards.read(first * window, count * window).reshape(count, window)
        yield torch.from_numpy(tokens.astype(np.int64))


def _window_count(shards: TokenShards, window: int, needed: int) -> int:
    windows = len(shards) // window
    if windows < needed:
        raise DataError(
            f"{shards.path}: the {shards.split} split's {len(shards)} tokens make {windows} "
            f"windows of {window} tokens, fewer than the {needed} needed"
        )
    return windows
