"""Packed token shards for language-model training: writer, reader and batch samplers.

A shard directory holds::

    index.json                   format version, token dtype, vocabulary size, eos id, tokenizer,
                                 the writing settings, and per split its shards (file, tokens,
                                 sha256 of the bytes) with token and document totals
    train/shard_00000.bin, ...   raw little-endian tokens: uint16 when the vocabulary fits,
                                 else uint32
    test/shard_00000.bin, ...
    progress.json                only while writing: what a resumed run continues from

Each document is tokenized without special tokens and followed by eos; a split is the
concatenation of its documents. Every shard but a split's last holds exactly ``shard_tokens``
tokens, so a document that does not fit continues in the next shard.

Document ``i`` goes to the test split when a hash of ``(seed, i)`` falls below
``test_fraction``. If no document does, the last one does, so that a small corpus still gets
a test split. A corpus with a held-out set of its own (WikiText's validation file) passes it as
``test_documents`` instead, and every one of ``documents`` is trained on.

Data that comes with its own splits (any names) is written by ``write_token_streams`` from
documents given as token ids, each followed by eos as above; ``TokenShards`` reads any split
the index lists.

Reading checks the index (every field's type and range, shard files inside the directory
and of the size the index gives) and raises a one-line ``DataError`` naming the file; a
token id outside the vocabulary is reported when it is read.

Resuming: after each shard, ``progress.json`` records per split the shards written and where
the next shard starts (a document index and a token offset into that document). A resumed run
reads the documents again from the start but tokenizes only those at or past their split's
position, so it rebuilds the partly filled shards exactly: the output is byte-identical to
an uninterrupted run's, whatever ``workers`` and ``batch_documents`` are.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import multiprocessing
import os
import re
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from implicitlm.core.atomic_io import atomic_write, write_json
from implicitlm.core.errors import DataError, check_header, check_int, quoted
from implicitlm.data.groups import smallest_uint_dtype
from implicitlm.core.json_file import read_json_object

FORMAT_VERSION = 1
SPLITS = ("train", "test")
INDEX_FILE = "index.json"
PROGRESS_FILE = "progress.json"
INDEX_KEYS = {"format_version", "dtype", "vocab_size", "eos_token_id", "tokenizer", "splits"}
TOKEN_DTYPES = ("uint16", "uint32")
# Where a shard of split "name" lies: "name/shard_00000.bin", inside the directory.
SHARD_FILE = re.compile(r"(?P<split>[^/\\]+)/shard_[0-9]{5,}\.bin")
# atomic_write's temporary files, which a killed run can leave behind.
TEMPORARY_PATTERNS = (f".{PROGRESS_FILE}.*.tmp", *(f"{split}/.shard_*.tmp" for split in SPLITS))
OUTPUT_PATTERNS = (
    INDEX_FILE,
    PROGRESS_FILE,
    f".{INDEX_FILE}.*.tmp",
    *TEMPORARY_PATTERNS,
    *(f"{split}/shard_*.bin" for split in SPLITS),
)
# Tokenized batches in flight per worker: enough to keep the workers busy, few enough to keep
# memory flat however long the corpus.
BATCHES_PER_WORKER = 2

Labelled = tuple[int, str, str]  # document index, split, text

# The tokenizer of a tokenization worker process, set once when the process starts.
_worker_tokenizer: PreTrainedTokenizerBase | None = None


def token_dtype(vocab_size: int) -> np.dtype:
    """The little-endian shard dtype for a vocabulary: uint16 when it fits, else uint32."""
    return np.promote_types(smallest_uint_dtype(vocab_size), np.uint16).newbyteorder("<")


def write_shards(
    documents: Iterable[str],
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | os.PathLike,
    shard_tokens: int = 2**24,
    test_fraction: float = 0.001,
    seed: int = 0,
    workers: int = 1,
    batch_documents: int = 256,
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    test_documents: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Tokenize ``documents`` into train and test shards under ``out_dir``; returns the index.

    The test split is ``test_documents`` when given (``test_fraction`` is then not used),
    else a ``test_fraction`` share of ``documents``.

    ``workers > 1`` tokenizes batches of ``batch_documents`` in that many processes. A
    directory that holds finished shards is only replaced with ``overwrite=True``; one that
    holds an unfinished run is continued with ``resume=True``, given the same documents,
    tokenizer and settings (``resume=True`` on a finished directory returns its index).
    """
    _check_positive(shard_tokens=shard_tokens, workers=workers, batch_documents=batch_documents)
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in [0, 1), got {test_fraction!r}")
    out_dir = Path(out_dir)
    # The settings record how the test split was chosen, so that resuming cannot switch.
    settings = _settings(tokenizer, shard_tokens, None if test_documents is not None else test_fraction, seed)
    finished = _finished_index(out_dir, settings, resume, overwrite)
    if finished is not None:
        return finished
    saved = _saved_progress(out_dir, settings, resume, overwrite)
    writers = {
        split: _SplitWriter(out_dir, split, settings, saved["splits"][split] if saved else None)
        for split in SPLITS
    }
    labelled = tqdm(
        _assign_splits(documents, test_fraction, seed) if test_documents is None
        else _given_splits(documents, test_documents),
        desc="tokenize",
        unit="doc",
        disable=not progress,
    )
    unwritten = _unwritten(labelled, writers)
    for index, split, tokens in _tokenized(unwritten, tokenizer, workers, batch_documents):
        if writers[split].add(index, tokens):
            splits = {name: writer.state() for name, writer in writers.items()}
            write_json(out_dir / PROGRESS_FILE, {**settings, "splits": splits})
    return _finish(out_dir, settings, writers)


def write_token_streams(
    splits: dict[str, Iterable[np.ndarray]],
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | os.PathLike,
    shard_tokens: int = 2**24,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write documents given as token ids, already assigned to named splits; returns the index.

    For data with splits of its own (any names besides "train" and "test"): each document of
    ``splits[name]`` is followed by eos and packed into that split's shards in the order
    given, as ``write_shards`` does. There is no resuming: the whole write is one step.
    """
    _check_positive(shard_tokens=shard_tokens)
    out_dir = Path(out_dir)
    settings = _token_settings(tokenizer, shard_tokens)
    _finished_index(out_dir, settings, resume=False, overwrite=overwrite)
    _remove(out_dir, (*OUTPUT_PATTERNS, *(f"{split}/shard_*.bin" for split in splits)))
    writers = {split: _SplitWriter(out_dir, split, settings, None) for split in splits}
    eos = np.array([settings["eos_token_id"]], dtype=np.uint32)
    for split, documents in splits.items():
        for index, tokens in enumerate(documents):
            writers[split].count_document(index)
            writers[split].add(index, np.concatenate([np.asarray(tokens, dtype=np.uint32), eos]))
    return _finish(out_dir, settings, writers)


class TokenShards:
    """One split of a shard directory as a single token sequence, memory-mapped read-only.

    Checks at opening that every shard has the size the index gives it (a truncated shard
    fails here) and, with ``verify=True``, its sha256 checksum.
    """

    def __init__(self, out_dir: str | os.PathLike, split: str = "train", verify: bool = False):
        self.path = Path(out_dir)
        self.split = split
        index_path = self.path / INDEX_FILE
        index = _read_index(index_path)
        if split not in index["splits"]:
            raise DataError(f"{index_path}: no split {quoted(split)}; it has {sorted(index['splits'])}")
        self.dtype = np.dtype(index["dtype"]).newbyteorder("<")
        self.vocab_size = index["vocab_size"]
        self.eos_token_id = index["eos_token_id"]
        self.tokenizer = index["tokenizer"]
        self._shards = [
            _open_shard(index_path, record, self.dtype, verify)
            for record in index["splits"][split]["shards"]
        ]
        self._starts = np.cumsum([0, *map(len, self._shards)], dtype=np.int64)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``start .. start + length - 1`` of the split, across shards, as a new array."""
        if start < 0 or length < 0 or start + length > len(self):
            raise IndexError(
                f"cannot read {length} tokens at {start} from {self.path} ({self.split}): "
                f"it has {len(self)}"
            )
        tokens = np.empty(length, dtype=self.dtype)
        shard = int(np.searchsorted(self._starts, start, side="right")) - 1
        done = 0
        while done < length:
            offset = start + done - int(self._starts[shard])
            count = min(length - done, len(self._shards[shard]) - offset)
            tokens[done : done + count] = self._shards[shard][offset : offset + count]
            done += count
            shard += 1
        # Checked here rather than at opening, which would read every shard: an id past the
        # vocabulary would index past an embedding table.
        if length and int(tokens.max()) >= self.vocab_size:
            raise DataError(
                f"{self.path} ({self.split}): token id {int(tokens.max())} at or after token {start} "
                f"is not below the vocabulary size {self.vocab_size}: a shard is corrupt"
            )
        return tokens


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
        _check_positive(
            sequence_length=sequence_length, batch_size=batch_size, world_size=world_size
        )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, {world_size}), got {rank!r}")
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
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "sequence_length": self.sequence_length,
            "windows": self.windows,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue where the sampler that gave ``state`` left off; it must match this one."""
        for key in ("seed", "sequence_length", "windows"):
            if state[key] != getattr(self, key):
                raise ValueError(
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
    _check_positive(sequence_length=sequence_length, batch_size=batch_size)
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


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _settings(
    tokenizer: PreTrainedTokenizerBase, shard_tokens: int, test_fraction: float | None, seed: int
) -> dict[str, Any]:
    """Everything the bytes written depend on, besides the documents."""
    return {
        **_token_settings(tokenizer, shard_tokens),
        "test_fraction": test_fraction,
        "seed": seed,
    }


def _token_settings(tokenizer: PreTrainedTokenizerBase, shard_tokens: int) -> dict[str, Any]:
    """The settings that shards of already split documents depend on."""
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no eos token to separate documents with"
        )
    return {
        "format_version": FORMAT_VERSION,
        "dtype": token_dtype(len(tokenizer)).name,
        "vocab_size": len(tokenizer),
        "eos_token_id": int(tokenizer.eos_token_id),
        "tokenizer": tokenizer.name_or_path,
        "shard_tokens": shard_tokens,
    }


def _finished_index(
    out_dir: Path, settings: dict[str, Any], resume: bool, overwrite: bool
) -> dict[str, Any] | None:
    index_path = out_dir / INDEX_FILE
    if overwrite or not index_path.exists():
        return None
    if not resume:
        raise DataError(f"{out_dir}: holds finished shards; replace them with --overwrite (overwrite=True)")
    index = _read_index(index_path)
    _check_settings(index_path, index, settings)
    return index


def _saved_progress(
    out_dir: Path, settings: dict[str, Any], resume: bool, overwrite: bool
) -> dict[str, Any] | None:
    """The progress record to continue from, or None after clearing the way for a fresh run."""
    progress_path = out_dir / PROGRESS_FILE
    if progress_path.exists() and not overwrite:
        if not resume:
            raise DataError(
                f"{out_dir}: holds an unfinished run; continue it with --resume (resume=True) "
                f"or start again with --overwrite (overwrite=True)"
            )
        saved = read_json_object(progress_path, "shard writing progress")
        _check_settings(progress_path, saved, settings)
        _check_progress(progress_path, saved, settings)
        _remove(out_dir, TEMPORARY_PATTERNS)
        return saved
    # Shards of an earlier, longer run would otherwise outlive it under their old names.
    _remove(out_dir, OUTPUT_PATTERNS)
    return None


def _finish(
    out_dir: Path, settings: dict[str, Any], writers: dict[str, _SplitWriter]
) -> dict[str, Any]:
    """Write the last, partly filled shards and the index; returns the index."""
    if not any(writer.documents for writer in writers.values()):
        raise DataError(f"{out_dir}: no documents to write")
    for writer in writers.values():
        writer.finish()
    splits = {name: writer.summary() for name, writer in writers.items()}
    documents = sum(split["documents"] for split in splits.values())
    index = {**settings, "documents": documents, "splits": splits}
    write_json(out_dir / INDEX_FILE, index)
    # A corpus smaller than one shard finishes without ever having written progress.
    (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    return index


def _check_settings(path: Path, saved: dict[str, Any], settings: dict[str, Any]) -> None:
    changed = sorted(key for key, value in settings.items() if saved.get(key) != value)
    if changed:
        raise DataError(
            f"{path}: was written with other settings ({', '.join(changed)}); "
            f"start again with --overwrite (overwrite=True)"
        )


def _remove(out_dir: Path, patterns: Iterable[str]) -> None:
    for pattern in patterns:
        for path in out_dir.glob(pattern):
            if path.is_dir():  # not a file this module wrote: left for its owner to look at
                raise DataError(f"{path}: expected a shard file, got a directory")
            path.unlink()


def _assign_splits(documents: Iterable[str], test_fraction: float, seed: int) -> Iterator[Labelled]:
    """Each document with its index and split, in order (see the module docstring)."""
    previous: Labelled | None = None
    any_test = False
    for index, text in enumerate(documents):
        # One document of lookahead: only the last one may be moved to the test split.
        if previous is not None:
            yield previous
        split = "test" if _hashed_fraction(seed, index) < test_fraction else "train"
        any_test = any_test or split == "test"
        previous = (index, split, text)
    if previous is not None:
        index, split, text = previous
        yield index, "test" if test_fraction > 0 and not any_test else split, text


def _given_splits(documents: Iterable[str], test_documents: Iterable[str]) -> Iterator[Labelled]:
    """Every training document, then every held-out one, indexed on from the last."""
    splits = itertools.chain(
        zip(itertools.repeat("train"), documents), zip(itertools.repeat("test"), test_documents)
    )
    for index, (split, text) in enumerate(splits):
        yield index, split, text


def _unwritten(
    labelled: Iterable[Labelled], writers: dict[str, _SplitWriter]
) -> Iterator[Labelled]:
    """The documents whose tokens are not in written shards yet; counts every document."""
    for index, split, text in labelled:
        if writers[split].count_document(index):
            yield index, split, text


def _hashed_fraction(seed: int, index: int) -> float:
    """A number in [0, 1) that looks uniformly random but depends only on (seed, index)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def _tokenized(
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


class _SplitWriter:
    """Packs one split's documents into shards of exactly ``shard_tokens`` tokens (the last
    may be shorter) and records where the next shard starts."""

    def __init__(
        self, out_dir: Path, split: str, settings: dict[str, Any], state: dict[str, Any] | None
    ):
        self.out_dir = out_dir
        self.split = split
        self.dtype = np.dtype(settings["dtype"]).newbyteorder("<")
        self.vocab_size = settings["vocab_size"]
        self.shard_tokens = settings["shard_tokens"]
        state = state or {"shards": [], "next_document": 0, "next_token": 0}
        self.shards: list[dict[str, Any]] = list(state["shards"])
        # Where the next shard starts: a document index and a token offset into it.
        self.next_document: int = state["next_document"]
        self.next_token: int = state["next_token"]
        self.documents = 0
        self.buffer: list[np.ndarray] = []
        self.buffered = 0

    def count_document(self, index: int) -> bool:
        """Count document ``index`` as this split's; whether its tokens are still to be added."""
        self.documents += 1
        return index >= self.next_document

    def add(self, index: int, tokens: np.ndarray) -> bool:
        """Buffer a document's tokens and write the shards they fill; whether there were any."""
        # Only on a resumed run does the document the last shard ended in come again; the
        # first next_token of its tokens are in that shard already.
        start = self.next_token if index == self.next_document else 0
        self.buffer.append(tokens[start:])
        self.buffered += len(tokens) - start
        if self.buffered < self.shard_tokens:
            return False
        # What stays buffered is the tail of this document: the buffer held less than a
        # shard before it came.
        buffered = np.concatenate(self.buffer)
        whole = len(buffered) - len(buffered) % self.shard_tokens
        for first in range(0, whole, self.shard_tokens):
            self._write_shard(buffered[first : first + self.shard_tokens])
        rest = buffered[whole:]
        self.buffer, self.buffered = [rest], len(rest)
        if len(rest):
            self.next_document, self.next_token = index, len(tokens) - len(rest)
        else:
            self.next_document, self.next_token = index + 1, 0
        return True

    def finish(self) -> None:
        if self.buffered:
            self._write_shard(np.concatenate(self.buffer))
        self.buffer, self.buffered = [], 0

    def state(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "next_document": self.next_document,
            "next_token": self.next_token,
        }

    def summary(self) -> dict[str, Any]:
        return {
            "tokens": sum(shard["tokens"] for shard in self.shards),
            "documents": self.documents,
            "shards": self.shards,
        }

    def _write_shard(self, tokens: np.ndarray) -> None:
        if int(tokens.max()) >= self.vocab_size:
            raise ValueError(
                f"token id {int(tokens.max())} is not below the tokenizer's length "
                f"{self.vocab_size}, which sets the shard dtype"
            )
        data = np.ascontiguousarray(tokens, dtype=self.dtype)
        name = f"{self.split}/shard_{len(self.shards):05d}.bin"
        atomic_write(self.out_dir / name, data.tofile)
        self.shards.append(
            {"file": name, "tokens": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )


def _read_index(path: Path) -> dict[str, Any]:
    """The index at ``path``, every field checked."""
    if not path.is_file():
        raise DataError(f"{path}: no shard index; write the shards with write_shards first")
    index = read_json_object(path, "a shard index")
    check_header(index, INDEX_KEYS, FORMAT_VERSION, path, "a shard index")
    dtype = index["dtype"]
    if dtype not in TOKEN_DTYPES:
        raise DataError(f"{path}: expected 'dtype' to be one of {', '.join(TOKEN_DTYPES)}, got {quoted(dtype)}")
    vocab_size = check_int(index["vocab_size"], path, "vocab_size", minimum=1)
    if vocab_size - 1 > np.iinfo(dtype).max:
        raise DataError(f"{path}: expected a vocab_size that {dtype} holds, got {vocab_size}")
    eos = check_int(index["eos_token_id"], path, "eos_token_id")
    if eos >= vocab_size:
        raise DataError(f"{path}: expected 'eos_token_id' below vocab_size {vocab_size}, got {eos}")
    if not isinstance(index["tokenizer"], str):
        raise DataError(f"{path}: expected 'tokenizer' to be a string, got {quoted(index['tokenizer'])}")
    splits = index["splits"]
    if not isinstance(splits, dict):
        raise DataError(f"{path}: expected 'splits' to be an object, got {quoted(splits)}")
    for name, split in splits.items():
        if not isinstance(split, dict) or not isinstance(split.get("shards"), list):
            raise DataError(f"{path}: expected split {quoted(name)} to be an object with a list of 'shards'")
        _check_shard_records(path, name, split["shards"])
    return index


def _check_progress(path: Path, saved: dict[str, Any], settings: dict[str, Any]) -> None:
    """A progress record to resume from: per split, written shards that are all there, whole."""
    splits = saved.get("splits")
    if not isinstance(splits, dict) or not all(isinstance(splits.get(split), dict) for split in SPLITS):
        raise DataError(f"{path}: expected 'splits' to hold an object for each of {list(SPLITS)}")
    dtype = np.dtype(settings["dtype"])
    for name in SPLITS:
        state = splits[name]
        shards = state.get("shards")
        if not isinstance(shards, list):
            raise DataError(f"{path}: expected split {name!r} to hold a list of 'shards'")
        _check_shard_records(path, name, shards)
        check_int(state.get("next_document"), path, f"splits.{name}.next_document")
        check_int(state.get("next_token"), path, f"splits.{name}.next_token")
        # The finished index will vouch for these shards' checksums: check them now.
        for record in shards:
            _open_shard(path, record, dtype, verify=True)


def _check_shard_records(path: Path, split: str, records: list[Any]) -> None:
    for number, record in enumerate(records):
        where = f"split {quoted(split)} shard {number}"
        if not isinstance(record, dict) or not {"file", "tokens", "sha256"} <= set(record):
            raise DataError(f"{path}: expected {where} to be an object with file, tokens and sha256")
        match = SHARD_FILE.fullmatch(record["file"]) if isinstance(record["file"], str) else None
        # The file must lie inside the directory: an index is no way to read any other file.
        if match is None or match["split"] in (".", ".."):
            raise DataError(
                f"{path}: expected the file of {where} to be '<split>/shard_NNNNN.bin', "
                f"got {quoted(record['file'])}"
            )
        check_int(record["tokens"], path, f"tokens of {where}", minimum=1)
        if not isinstance(record["sha256"], str):
            raise DataError(f"{path}: expected the sha256 of {where} to be a string")


def _shard_size(index_path: Path, record: dict[str, Any], dtype: np.dtype) -> Path:
    """The shard file ``record`` names, which must hold exactly its tokens."""
    path = index_path.parent / record["file"]
    expected = record["tokens"] * dtype.itemsize
    if not path.is_file():
        found = "a directory" if path.is_dir() else "missing"
        raise DataError(f"{path}: {found}, though {index_path} lists it as a shard")
    size = path.stat().st_size
    if size != expected:
        raise DataError(
            f"{path}: expected {expected} bytes ({record['tokens']} tokens) as {index_path} "
            f"says, got {size}: the shard is truncated or from another run"
        )
    return path


def _open_shard(
    index_path: Path, record: dict[str, Any], dtype: np.dtype, verify: bool
) -> np.memmap:
    path = _shard_size(index_path, record, dtype)
    tokens = np.memmap(path, dtype=dtype, mode="r")
    if verify and hashlib.sha256(tokens).hexdigest() != record["sha256"]:
        raise DataError(f"{path}: sha256 checksum differs from {index_path}: the shard is corrupt")
    return tokens
