"""What each task trains on: endless ``(input_ids, labels)`` micro-batches, labels aligned
with their positions, each process reading its own rows of every global micro-batch.

Micro-batch ``k`` of a run is always the same words or windows, whatever the number of
processes: the ranks together see what one process with their global batch would, and a
resumed run goes on from where its checkpoint stood.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import OptionError
from ..data.groups import get_group
from ..data.shards import TokenShards
from ..data.token_windows import TokenSampler
from ..data.tokenizer import load_tokenizer
from ..data.words import WordData, generate_words
from .config import TrainConfig


class WordBatches:
    """Word problems: fresh words drawn from ``(seed, micro-batch)``, or, from a word file, a
    seeded shuffle per epoch (the rows of a batch read in sorted order, which a memory map
    serves faster); labels derived here when the file does not store them."""

    def __init__(self, config: TrainConfig, data: WordData | None, rank: int = 0, world_size: int = 1):
        self.config, self.data, self.rank, self.world_size = config, data, rank, world_size
        self.global_rows = config.batch_size * world_size
        if data is not None and data.inputs.shape[0] < self.global_rows:
            raise ValueError(
                f"training file has {data.inputs.shape[0]} sequences, fewer than the batch size {self.global_rows}"
            )
        self.position = 0  # micro-batches handed out so far
        self.tokenizer = None  # a word's tokens are the group's elements

    def __iter__(self) -> WordBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self._rows(self.position)
        self.position += 1
        return _to_tensors(inputs, targets)

    def _rows(self, micro_batch: int) -> tuple[np.ndarray, np.ndarray]:
        config = self.config
        own = slice(self.rank * config.batch_size, (self.rank + 1) * config.batch_size)
        if self.data is None:
            inputs, targets = generate_words(
                get_group(config.group), config.sequence_length, self.global_rows,
                seed=_micro_batch_seed(config.seed, micro_batch), hard_prob=config.hard_prob,
            )
            return inputs[own], targets[own]
        count = self.data.inputs.shape[0]
        epoch, index = divmod(micro_batch, count // self.global_rows)
        order = np.random.default_rng([config.seed, epoch]).permutation(count)
        rows = np.sort(order[index * self.global_rows:(index + 1) * self.global_rows][own])
        return self.data.inputs[rows], self.data.targets[rows]

    def state_dict(self) -> dict[str, int]:
        return {"micro_batches": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["micro_batches"])

    def description(self) -> dict[str, Any] | None:
        """What identifies the training words: None for fresh words drawn from the seed."""
        if self.data is None:
            return None
        inputs = self.data.inputs
        shape = {"group": self.data.group, "count": int(inputs.shape[0]), "length": int(inputs.shape[1])}
        return {**shape, "inputs_sha256": _inputs_digest(inputs)}

    def prepare(self, model) -> None:
        order = get_group(self.config.group).order
        if model.config.vocab_size < order:
            raise OptionError(f"the model's vocab_size {model.config.vocab_size} is smaller than {self.config.group}'s {order} elements")


class TokenBatches:
    """Language modelling: windows of ``sequence_length + 1`` tokens from the training shards,
    the first ``sequence_length`` as inputs, the last ``sequence_length`` as labels."""

    def __init__(self, config: TrainConfig, shards: TokenShards, rank: int = 0, world_size: int = 1):
        self.shards = shards
        # A local tokenizer folder may not travel with the checkpoints, so they carry a copy;
        # a hub name stays findable.
        self.tokenizer = load_tokenizer(shards.tokenizer) if Path(shards.tokenizer).is_dir() else None
        self.sampler = TokenSampler(
            shards, config.sequence_length, config.batch_size, seed=config.seed, rank=rank, world_size=world_size
        )

    def __iter__(self) -> TokenBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        window = next(self.sampler)
        return window[:, :-1], window[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)

    def description(self) -> None:
        return None

    def prepare(self, model) -> None:
        """The shards' vocabulary must fit the model; their eos id goes into its configs."""
        if self.shards.vocab_size > model.config.vocab_size:
            raise OptionError(
                f"the shards' tokenizer has {self.shards.vocab_size} tokens, more than the model's vocab_size "
                f"{model.config.vocab_size}"
            )
        mark_end_of_text(model, self.shards.eos_token_id)


def mark_end_of_text(model, eos_token_id: int) -> None:
    """The shards' eos id in the model's config and generation config, so that a trained
    checkpoint's ``generate()`` stops at the end of a text and pads finished rows with it
    (the shards have no padding token of their own)."""
    for config in (model.config, model.generation_config):
        config.eos_token_id = eos_token_id
        config.pad_token_id = eos_token_id


def _micro_batch_seed(seed: int, micro_batch: int) -> int:
    return int(np.random.SeedSequence([seed, micro_batch]).generate_state(1)[0])


def _inputs_digest(inputs: np.ndarray, rows_per_chunk: int = 65536) -> str:
    """SHA-256 of the words' element indices (as little-endian int64, whatever the file's
    dtype), read in chunks so that a memory-mapped file is not loaded whole. The targets
    follow from the inputs and the group."""
    digest = hashlib.sha256()
    for start in range(0, inputs.shape[0], rows_per_chunk):
        digest.update(np.ascontiguousarray(inputs[start:start + rows_per_chunk], dtype="<i8").tobytes())
    return digest.hexdigest()


def _to_tensors(inputs: np.ndarray, targets: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(targets.astype(np.int64))
