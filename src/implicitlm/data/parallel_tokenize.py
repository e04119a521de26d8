"""Documents to token ids for the shard writer: in batches, in worker processes when asked,
and always in the order given, so that the shards do not depend on the number of workers."""

from __future__ import annotations

import collections
import itertools
import multiprocessing
from multiprocessing.pool import AsyncResult
from typing import Iterable, Iterator

import numpy as np
from transformers import PreTrainedTokenizerBase

# Tokenized batches in flight per worker: enough to keep the workers busy, few enough to keep
# memory flat however long the corpus.
BATCHES_PER_WORKER = 2

Labelled = tuple[int, str, str]  # document index, split, text

# The tokenizer of a tokenization worker process, set once when the process starts.
_worker_tokenizer: PreTrainedTokenizerBase | None = None


def tokenized(
    labelled: Iterable[Labelled],
    tokenizer: PreTrainedTokenizerBase,
    workers: int,
    batch_documents: int,
) -> Iterator[tuple[int, str, np.ndarray]]:
    """Each document's index, split and tokens (eos last), in the order given."""
    batches = _batched(labelled, batch_documents)
    for batch, encoded in _encoded_batches(batches, tokenizer, workers):
        for (index, split, _), tokens in zip(batch, encoded):
            yield index, split, tokens


def _batched(items: Iterable[Labelled], size: int) -> Iterator[list[Labelled]]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _encoded_batches(
    batches: Iterable[list[Labelled]], tokenizer: PreTrainedTokenizerBase, workers: int
) -> Iterator[tuple[list[Labelled], list[np.ndarray]]]:
    if workers == 1:
        for batch in batches:
            yield batch, _encode(tokenizer, [text for *_, text in batch])
        return
    # Results are collected in submission order, so the output does not depend on workers.
    with multiprocessing.Pool(workers, _start_worker, (tokenizer,)) as pool:
        in_flight: collections.deque[tuple[list[Labelled], AsyncResult]] = collections.deque()
        for batch in batches:
            texts = [text for *_, text in batch]
            in_flight.append((batch, pool.apply_async(_encode_in_worker, (texts,))))
            if len(in_flight) > BATCHES_PER_WORKER * workers:
                yield _collect(in_flight.popleft())
        while in_flight:
            yield _collect(in_flight.popleft())


def _collect(
    submitted: tuple[list[Labelled], AsyncResult],
) -> tuple[list[Labelled], list[np.ndarray]]:
    batch, result = submitted
    return batch, result.get()


def _start_worker(tokenizer: PreTrainedTokenizerBase) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _encode_in_worker(texts: list[str]) -> list[np.ndarray]:
    return _encode(_worker_tokenizer, texts)


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[np.ndarray]:
    # verbose=False: documents longer than the model's context are expected here.
    encoded = tokenizer(
        texts, add_special_tokens=False, return_attention_mask=False, verbose=False
    )
    eos = tokenizer.eos_token_id
    return [np.array([*ids, eos], dtype=np.uint32) for ids in encoded["input_ids"]]
