"""Pieces of documents to token ids for the shard writer: in batches of a bounded number of
characters, in worker processes when asked, and always in the order given, so that the
shards do not depend on the number of workers."""

from __future__ import annotations

import collections
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Iterable, Iterator

import numpy as np
from transformers import PreTrainedTokenizerBase

from implicitlm.core.memory import require

# Tokenized batches in flight per worker: enough to keep the workers busy, few enough to keep
# memory flat however long the corpus.
BATCHES_PER_WORKER = 2
# Characters a batch holds at most (a piece more when one piece is longer): what a tokenizer
# holds per character it is handed is what bounds the memory of tokenizing.
BATCH_CHARACTERS = 2**18

# A worker process's own memory, at least: measured at 28 MiB of private pages after one batch
# (a forked interpreter's pages it writes to, its tokenizer's buffers, its batches).
WORKER_BYTES_AT_LEAST = 16 * 2**20

# A piece of a document: the document's index, its split, the piece's text, and whether the
# piece ends the document.
Labelled = tuple[int, str, str, bool]

# The tokenizer of a tokenization worker process, set once when the process starts.
_worker_tokenizer: PreTrainedTokenizerBase | None = None


def tokenized(
    labelled: Iterable[Labelled],
    tokenizer: PreTrainedTokenizerBase,
    workers: int,
    batch_pieces: int,
) -> Iterator[tuple[int, str, np.ndarray, bool]]:
    """Each piece's document index, split, tokens (eos last where the piece ends its
    document) and whether it ends it, in the order given; ``batch_pieces`` pieces at most
    to a batch."""
    batches = _batched(labelled, batch_pieces)
    for batch, encoded in _encoded_batches(batches, tokenizer, workers):
        for (index, split, _, ends), tokens in zip(batch, encoded):
            yield index, split, tokens, ends


def require_workers(workers: int) -> None:
    """Refuse, before any process starts, more workers than the machine's memory holds: each
    forked worker is a process of its own, and thousands of them stall the machine."""
    if workers > 1:
        require(f"tokenizing in {workers:,} processes", workers * WORKER_BYTES_AT_LEAST,
                hint="; give fewer workers", arguments=("workers",))


def _batched(items: Iterable[Labelled], size: int) -> Iterator[list[Labelled]]:
    batch: list[Labelled] = []
    characters = 0
    for item in items:
        batch.append(item)
        characters += len(item[2])
        if len(batch) == size or characters >= BATCH_CHARACTERS:
            yield batch
            batch, characters = [], 0
    if batch:
        yield batch


def _encoded_batches(
    batches: Iterable[list[Labelled]], tokenizer: PreTrainedTokenizerBase, workers: int
) -> Iterator[tuple[list[Labelled], list[np.ndarray]]]:
    if workers == 1:
        for batch in batches:
            yield batch, _encode(tokenizer, _pieces(batch))
        return
    # Results are collected in submission order, so the output does not depend on workers. An
    # executor, not a multiprocessing.Pool: a run stopped early (an error, a signal) waits for
    # the few batches in flight, where a Pool's terminate could hang on a queue lock that a
    # worker it killed held.
    with ProcessPoolExecutor(workers, initializer=_start_worker, initargs=(tokenizer,)) as pool:
        in_flight: collections.deque[tuple[list[Labelled], Future]] = collections.deque()
        for batch in batches:
            in_flight.append((batch, pool.submit(_encode_in_worker, _pieces(batch))))
            if len(in_flight) > BATCHES_PER_WORKER * workers:
                yield _collect(in_flight.popleft())
        while in_flight:
            yield _collect(in_flight.popleft())


def _collect(
    submitted: tuple[list[Labelled], Future],
) -> tuple[list[Labelled], list[np.ndarray]]:
    batch, result = submitted
    return batch, result.result()


def _start_worker(tokenizer: PreTrainedTokenizerBase) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _pieces(batch: list[Labelled]) -> list[tuple[str, bool]]:
    return [(text, ends) for _, _, text, ends in batch]


def _encode_in_worker(pieces: list[tuple[str, bool]]) -> list[np.ndarray]:
    return _encode(_worker_tokenizer, pieces)


def _encode(tokenizer: PreTrainedTokenizerBase, pieces: list[tuple[str, bool]]) -> list[np.ndarray]:
    """Each piece's tokens, followed by eos where it ends its document."""
    # verbose=False: documents longer than the model's context are expected here.
    encoded = tokenizer(
        [text for text, _ in pieces], add_special_tokens=False, return_attention_mask=False, verbose=False
    )
    eos = tokenizer.eos_token_id
    return [
        np.array([*ids, eos] if ends else ids, dtype=np.uint32)
        for ids, (_, ends) in zip(encoded["input_ids"], pieces)
    ]
