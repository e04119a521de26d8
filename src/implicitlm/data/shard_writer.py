"""Writing a shard directory (its format: ``shards``): documents assigned to train or test
(``corpus_splits``), tokenized, packed into shards, and resumable after a crash.

Memory does not grow with the corpus nor with a document: documents are read and tokenized
in pieces (``corpus.text_pieces``), and shards are written as they fill.

Data that comes with its own splits (any names) is written by ``write_token_streams`` from
documents given as token ids, each followed by eos as ``write_shards`` does.

Resuming: after each shard, ``progress.json`` records per split the shards written and where
the next shard starts (a document index and a token offset into that document). A resumed run
reads the documents again from the start but tokenizes only those at or past their split's
position, so it rebuilds the partly filled shards exactly: the output is byte-identical to
an uninterrupted run's, whatever ``workers`` and ``batch_documents`` are.

A writer holds the directory (``core.targets.writer_lock``) while it writes: a second writer
of it is refused, in one line, rather than mixing its shards into the first one's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from implicitlm.core.atomic_io import atomic_write, staged_directory, write_json
from implicitlm.core.errors import DataError, OptionError, check_header, check_int
from implicitlm.core.json_file import read_json_object
from implicitlm.core.targets import FolderKind, refuse_another_kind, remove_stale_temporaries, writer_lock
from implicitlm.data.corpus import Document, Documents
from implicitlm.data.corpus_splits import assign_splits, given_splits
from implicitlm.data.parallel_tokenize import Labelled, require_workers, tokenized
from implicitlm.data.shards import (
    FORMAT_VERSION,
    INDEX_FILE,
    check_positive,
    check_shard_records,
    open_shard,
    read_index,
    token_dtype,
    tokenizer_digest,
)

SPLITS = ("train", "test")
PROGRESS_FILE = "progress.json"
# atomic_write's temporary files, which a killed run can leave behind.
TEMPORARY_PATTERNS = (f".{PROGRESS_FILE}.*.tmp", *(f"{split}/.shard_*.tmp" for split in SPLITS))
OUTPUT_PATTERNS = (
    INDEX_FILE,
    PROGRESS_FILE,
    f".{INDEX_FILE}.*.tmp",
    *TEMPORARY_PATTERNS,
    *(f"{split}/shard_*.bin" for split in SPLITS),
)
# What a build writes into its folder; any of its output (a killed build's first shard too)
# marks it, unless it is a catbAbI build's (data.catbabi's summary file), shards and more.
SHARD_FOLDER = FolderKind("token shards", marks=OUTPUT_PATTERNS, foreign=("catbabi.json",), entries=(
    INDEX_FILE, PROGRESS_FILE, f".{INDEX_FILE}.*.tmp", f".{PROGRESS_FILE}.*.tmp", *SPLITS,
))


def write_shards(
    documents: Documents | Iterable[str | Document],
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
    test_documents: Documents | Iterable[str | Document] | None = None,
) -> dict[str, Any]:
    """Tokenize ``documents`` into train and test shards under ``out_dir``; returns the index.

    The test split is ``test_documents`` when given (``test_fraction`` is then not used),
    else a ``test_fraction`` share of ``documents``.

    Documents are strings, ``Document``s, or ``read_documents``' (read in pieces).
    ``workers > 1`` tokenizes batches of ``batch_documents`` (pieces of documents, as many
    characters as ``parallel_tokenize.BATCH_CHARACTERS`` at most) in that many processes. A
    directory that holds finished shards is only replaced with ``overwrite=True``, by new
    shards built beside it (so a failure leaves it as it was); one that holds an unfinished
    run is continued with ``resume=True``, given the same documents, tokenizer and settings
    (``resume=True`` on a finished directory returns its index).
    """
    check_positive(shard_tokens=shard_tokens, workers=workers, batch_documents=batch_documents)
    require_workers(workers)
    if not 0.0 <= test_fraction < 1.0:
        raise OptionError(f"test_fraction must lie in [0, 1), got {test_fraction!r}")
    out_dir = Path(out_dir)
    # The settings record how the test split was chosen, so that resuming cannot switch.
    settings = _settings(tokenizer, shard_tokens, None if test_documents is not None else test_fraction, seed)
    with writer_lock(out_dir):
        remove_stale_temporaries(out_dir)  # a killed replacement's folder, built beside out_dir
        refuse_another_kind(out_dir, SHARD_FOLDER)
        finished = _finished_index(out_dir, settings, resume, overwrite)
        if finished is not None:
            return finished
        held_out_tail: dict[str, int] = {}
        labelled = (
            assign_splits(_documents(documents), test_fraction, seed, held_out_tail) if test_documents is None
            else given_splits(_documents(documents), _documents(test_documents))
        )
        pieces = tqdm(labelled, desc="tokenize", unit="piece", disable=not progress)
        # Finished shards are replaced only by finished shards: built beside, then renamed.
        replacing = overwrite and (out_dir / INDEX_FILE).exists()
        saved = None if replacing else _saved_progress(out_dir, settings, resume, overwrite)
        with staged_directory(out_dir, SHARD_FOLDER.keeps) if replacing else contextlib.nullcontext(out_dir) as folder:
            writers = _write_splits(pieces, tokenizer, folder, settings, saved, workers, batch_documents)
            _check_written(out_dir, writers)
            return _finish(folder, settings, writers, {"held_out_tail": held_out_tail or None})


def _documents(documents: Documents | Iterable[str | Document]) -> Iterator[Document]:
    """Documents as ``Document``s: ``read_documents``' as read, strings as documents of their text."""
    if isinstance(documents, Documents):
        return documents.streamed()
    return (document if isinstance(document, Document) else Document.of_text(document) for document in documents)


def _write_splits(
    labelled: Iterable[Labelled],
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path,
    settings: dict[str, Any],
    saved: dict[str, Any] | None,
    workers: int,
    batch_pieces: int,
) -> dict[str, _SplitWriter]:
    """Tokenize the pieces of ``labelled`` not written yet into each split's shards, going on
    from ``saved`` progress; the writers, with their last shards still to be written."""
    writers = {
        split: _SplitWriter(out_dir, split, settings, saved["splits"][split] if saved else None)
        for split in SPLITS
    }
    unwritten = _unwritten(labelled, writers)
    for index, split, tokens, ends in tokenized(unwritten, tokenizer, workers, batch_pieces):
        if writers[split].add(index, tokens, ends):
            splits = {name: writer.state() for name, writer in writers.items()}
            write_json(out_dir / PROGRESS_FILE, {**settings, "splits": splits})
    return writers


def _check_any_written(out_dir: Path, writers: dict[str, _SplitWriter]) -> None:
    if not any(writer.documents for writer in writers.values()):
        raise DataError(f"{out_dir}: no documents to write (none with text)")


def _check_written(out_dir: Path, writers: dict[str, _SplitWriter]) -> None:
    """Refuse shards of no document, and a test split with no training split beside it."""
    _check_any_written(out_dir, writers)
    trained = "train" in writers and writers["train"].documents
    if "test" in writers and writers["test"].documents and not trained:
        raise DataError(
            f"{out_dir}: nothing to train on: every document went to the test split (a last document of "
            f"one line is held out whole); give more text, a lower test fraction or a held-out set (--test-sources)"
        )


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
    check_positive(shard_tokens=shard_tokens)
    out_dir = Path(out_dir)
    settings = _token_settings(tokenizer, shard_tokens)
    _finished_index(out_dir, settings, resume=False, overwrite=overwrite)
    _remove(out_dir, (*OUTPUT_PATTERNS, *(f"{split}/shard_*.bin" for split in splits)))
    writers = {split: _SplitWriter(out_dir, split, settings, None) for split in splits}
    eos = np.array([settings["eos_token_id"]], dtype=np.uint32)
    for split, documents in splits.items():
        for index, tokens in enumerate(documents):
            writers[split].takes(index)
            writers[split].add(index, np.concatenate([np.asarray(tokens, dtype=np.uint32), eos]), ends=True)
    # Splits of their own: no train/test rule to hold them to.
    _check_any_written(out_dir, writers)
    return _finish(out_dir, settings, writers)


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
        raise DataError(
            f"tokenizer {tokenizer.name_or_path!r} has no eos token to separate documents with"
        )
    return {
        "format_version": FORMAT_VERSION,
        "dtype": token_dtype(len(tokenizer)).name,
        "vocab_size": len(tokenizer),
        "eos_token_id": int(tokenizer.eos_token_id),
        "tokenizer": tokenizer.name_or_path,
        "tokenizer_sha256": tokenizer_digest(tokenizer),
        "shard_tokens": shard_tokens,
    }


def _finished_index(
    out_dir: Path, settings: dict[str, Any], resume: bool, overwrite: bool
) -> dict[str, Any] | None:
    index_path = out_dir / INDEX_FILE
    if overwrite or not index_path.exists():
        return None
    if not resume:
        raise DataError(f"{out_dir}: holds finished shards; replace them with overwrite=True", arguments=("overwrite",))
    index = read_index(index_path)
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
                f"{out_dir}: holds an unfinished run; continue it with resume=True or start again with overwrite=True",
                arguments=("resume", "overwrite"),
            )
        what = "shard writing progress"
        saved = read_json_object(progress_path, what)
        check_header(saved, ("format_version", "splits"), FORMAT_VERSION, progress_path, what, optional=settings)
        _check_settings(progress_path, saved, settings)
        _check_progress(progress_path, saved, settings)
        _remove(out_dir, TEMPORARY_PATTERNS)
        return saved
    # Shards of an earlier, longer run would otherwise outlive it under their old names.
    _remove(out_dir, OUTPUT_PATTERNS)
    return None


def _finish(
    out_dir: Path,
    settings: dict[str, Any],
    writers: dict[str, _SplitWriter],
    split_record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the last, partly filled shards and the index (with ``split_record``, how the
    splits were chosen); returns the index."""
    for writer in writers.values():
        writer.finish()
    splits = {name: writer.summary() for name, writer in writers.items()}
    documents = sum(split["documents"] for split in splits.values())
    index = {**settings, **(split_record or {}), "documents": documents, "splits": splits}
    write_json(out_dir / INDEX_FILE, index)
    # A corpus smaller than one shard finishes without ever having written progress.
    (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    return index


def _check_settings(path: Path, saved: dict[str, Any], settings: dict[str, Any]) -> None:
    changed = sorted(key for key, value in settings.items() if saved.get(key) != value)
    if changed:
        raise DataError(
            f"{path}: was written with other settings ({', '.join(changed)}); start again with overwrite=True",
            arguments=("overwrite",),
        )


def _remove(out_dir: Path, patterns: Iterable[str]) -> None:
    for pattern in patterns:
        for path in out_dir.glob(pattern):
            if path.is_dir():  # not a file this module wrote: left for its owner to look at
                raise DataError(f"{path}: expected a shard file, got a directory")
            path.unlink()


def _unwritten(
    labelled: Iterable[Labelled], writers: dict[str, _SplitWriter]
) -> Iterator[Labelled]:
    """The pieces of the documents whose tokens are not in written shards yet; counts every
    document."""
    for piece in labelled:
        index, split, *_ = piece
        if writers[split].takes(index):
            yield piece


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
        # The document whose pieces are being counted (ahead of the tokenizer), and whether
        # they are taken; the document whose tokens are being added, and how many it has had.
        self.counting: int | None = None
        self.taking = True
        self.adding: int | None = None
        self.added = 0

    def takes(self, index: int) -> bool:
        """Whether a piece of document ``index`` is still to be tokenized; counts the document
        at its first piece."""
        if index != self.counting:
            self.counting = index
            self.documents += 1
            self.taking = index >= self.next_document
        return self.taking

    def add(self, index: int, tokens: np.ndarray, ends: bool) -> bool:
        """Buffer the tokens of a piece of document ``index`` (``ends``: its last) and write
        the shards they fill; whether there were any."""
        if index != self.adding:
            self.adding, self.added = index, 0
        first = self.added
        self.added += len(tokens)
        # Only on a resumed run does the document the last shard ended in come again; the
        # first next_token of its tokens are in that shard already.
        if index == self.next_document:
            tokens = tokens[max(0, self.next_token - first) :]
        self.buffer.append(tokens)
        self.buffered += len(tokens)
        if self.buffered < self.shard_tokens:
            return False
        # What stays buffered is the tail of this piece: the buffer held less than a shard
        # before it came.
        buffered = np.concatenate(self.buffer)
        whole = len(buffered) - len(buffered) % self.shard_tokens
        for shard_start in range(0, whole, self.shard_tokens):
            self._write_shard(buffered[shard_start : shard_start + self.shard_tokens])
        rest = buffered[whole:]
        self.buffer, self.buffered = [rest], len(rest)
        if len(rest) or not ends:
            self.next_document, self.next_token = index, self.added - len(rest)
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
            raise DataError(
                f"token id {int(tokens.max())} is not below the tokenizer's length "
                f"{self.vocab_size}, which sets the shard dtype"
            )
        data = np.ascontiguousarray(tokens, dtype=self.dtype)
        name = f"{self.split}/shard_{len(self.shards):05d}.bin"
        atomic_write(self.out_dir / name, data.tofile)
        self.shards.append(
            {"file": name, "tokens": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )


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
        check_shard_records(path, name, shards)
        check_int(state.get("next_document"), path, f"splits.{name}.next_document")
        check_int(state.get("next_token"), path, f"splits.{name}.next_token")
        # The finished index will vouch for these shards' checksums: check them now.
        for record in shards:
            open_shard(path, record, dtype, verify=True)
