"""Packed token shards: the directory format, and each split read as one token sequence.

A shard directory holds::

    index.json                   format version, token dtype, vocabulary size, eos id, tokenizer
                                 and its digest (``tokenizer_digest``; none for a tokenizer
                                 without a definition to hash), the writing settings, the lines
                                 of the last document held
                                 out when it was split (``held_out_tail``), and per split its
                                 shards (file, tokens, sha256 of the bytes) with token and
                                 document totals
    train/shard_00000.bin, ...   raw little-endian tokens: uint16 when the vocabulary fits,
                                 else uint32
    test/shard_00000.bin, ...
    progress.json                only while writing: what a resumed run continues from

Each document is tokenized without special tokens and followed by eos; a split is the
concatenation of its documents. Every shard but a split's last holds exactly ``shard_tokens``
tokens, so a document that does not fit continues in the next shard. ``shard_writer`` writes
such a directory; ``TokenShards`` reads any split the index lists.

Reading checks the index (every field's type and range, shard files inside the directory
and of the size the index gives) and raises a one-line ``DataError`` naming the file; a
token id outside the vocabulary is reported when it is read. An index of an earlier format
reads as today's (``core.migrations``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from implicitlm.core.errors import DataError, OptionError, OutOfRangeError, check_header, check_int, quoted
from implicitlm.data.groups import smallest_uint_dtype
from implicitlm.core.json_file import read_json_object
from implicitlm.core.migrations import shard_index_format_1

FORMAT_VERSION = 2
INDEX_FILE = "index.json"
INDEX_KEYS = {"format_version", "dtype", "vocab_size", "eos_token_id", "tokenizer", "tokenizer_sha256", "splits"}
# What shard_writer records beside them: how the shards were written and the splits chosen.
INDEX_OPTIONAL_KEYS = {"shard_tokens", "test_fraction", "seed", "held_out_tail", "documents"}
TOKEN_DTYPES = ("uint16", "uint32")
# Where a shard of split "name" lies: "name/shard_00000.bin", inside the directory.
SHARD_FILE = re.compile(r"(?P<split>[^/\\]+)/shard_[0-9]{5,}\.bin")
SHA256 = re.compile(r"[0-9a-f]{64}")
# Shards of one split mapped at once: a reader's file descriptors stay few, whatever the split's size.
MAX_MAPPED_SHARDS = 16


def tokenizer_digest(tokenizer: Any) -> str | None:
    """The sha256 of what decides a tokenizer's ids: a fast tokenizer's definition (model,
    vocabulary, merges, normalisation, added tokens), without the truncation and padding
    that each call may set; None for a tokenizer without one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    definition = json.loads(backend.to_str())
    for per_call in ("truncation", "padding"):
        definition.pop(per_call, None)
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    """The little-endian shard dtype for a vocabulary: uint16 when it fits, else uint32."""
    return np.promote_types(smallest_uint_dtype(vocab_size), np.uint16).newbyteorder("<")


class TokenShards:
    """One split of a shard directory as a single token sequence, memory-mapped read-only.

    Checks at opening that every shard has the size the index gives it (a truncated shard
    fails here) and, with ``verify=True``, its sha256 checksum; with ``verify_on_read=True``,
    each shard's checksum before its first tokens are read (a training run reads a split far
    larger than any test split: its start does not wait for every shard to be read).
    """

    def __init__(
        self, out_dir: str | os.PathLike, split: str = "train", verify: bool = False, verify_on_read: bool = False,
    ):
        self.path = Path(out_dir)
        self.split = split
        index_path = self.path / INDEX_FILE
        index = read_index(index_path)
        if split not in index["splits"]:
            raise DataError(f"{index_path}: no split {quoted(split)}; it has {sorted(index['splits'])}")
        self.dtype = np.dtype(index["dtype"]).newbyteorder("<")
        self.vocab_size = index["vocab_size"]
        self.eos_token_id = index["eos_token_id"]
        self.tokenizer = index["tokenizer"]
        self.tokenizer_sha256: str | None = index.get("tokenizer_sha256")
        records = index["splits"][split]["shards"]
        # What identifies the split's tokens without reading them: its shards' checksums, in order.
        self.sha256 = hashlib.sha256(json.dumps([index["dtype"], [r["sha256"] for r in records]]).encode()).hexdigest()
        for record in records:  # each shard whole (and of its checksum) now, its map dropped until read
            open_shard(index_path, record, self.dtype, verify)
        self._index_path, self._records = index_path, records
        self._unverified = set(range(len(records))) if verify_on_read and not verify else set()
        self._files = [index_path.parent / record["file"] for record in records]
        self.shard_tokens = [record["tokens"] for record in records]
        self._starts = np.cumsum([0, *self.shard_tokens], dtype=np.int64)
        self._mapped: dict[int, np.memmap] = {}

    def __len__(self) -> int:
        return int(self._starts[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``start .. start + length - 1`` of the split, across shards, as a new array."""
        if start < 0 or length < 0 or start + length > len(self):
            raise OutOfRangeError(
                f"cannot read {length} tokens at {start} from {self.path} ({self.split}): "
                f"it has {len(self)}"
            )
        tokens = np.empty(length, dtype=self.dtype)
        shard = int(np.searchsorted(self._starts, start, side="right")) - 1
        done = 0
        while done < length:
            if shard in self._unverified:
                check_checksum(self._index_path, self._records[shard], self._shard(shard))
                self._unverified.discard(shard)
            offset = start + done - int(self._starts[shard])
            count = min(length - done, self.shard_tokens[shard] - offset)
            tokens[done : done + count] = self._shard(shard)[offset : offset + count]
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

    def _shard(self, number: int) -> np.memmap:
        """Shard ``number`` memory-mapped; the least recently read map is closed past
        ``MAX_MAPPED_SHARDS``, since each holds a file descriptor and a split may have more
        shards than a process may open files."""
        mapped = self._mapped.pop(number, None)
        if mapped is None:
            mapped = np.memmap(self._files[number], dtype=self.dtype, mode="r")
            if len(self._mapped) >= MAX_MAPPED_SHARDS:
                del self._mapped[next(iter(self._mapped))]
        self._mapped[number] = mapped  # last: the most recently read
        return mapped


def check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise OptionError(f"{name} must be a positive integer, got {value!r}")


def read_index(path: Path) -> dict[str, Any]:
    """The index at ``path``, every field checked."""
    if not path.is_file():
        raise DataError(f"{path}: no shard index; build the shards with `implicitlm corpus build` (write_shards)")
    index = shard_index_format_1(read_json_object(path, "a shard index"))
    check_header(index, INDEX_KEYS, FORMAT_VERSION, path, "a shard index", optional=INDEX_OPTIONAL_KEYS)
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
    digest = index.get("tokenizer_sha256")
    if digest is not None and not (isinstance(digest, str) and SHA256.fullmatch(digest)):
        raise DataError(
            f"{path}: expected 'tokenizer_sha256' to be 64 hexadecimal digits or null, got {quoted(digest)}"
        )
    splits = index["splits"]
    if not isinstance(splits, dict):
        raise DataError(f"{path}: expected 'splits' to be an object, got {quoted(splits)}")
    for name, split in splits.items():
        if not isinstance(split, dict) or not isinstance(split.get("shards"), list):
            raise DataError(f"{path}: expected split {quoted(name)} to be an object with a list of 'shards'")
        check_shard_records(path, name, split["shards"])
    return index


def check_shard_records(path: Path, split: str, records: list[Any]) -> None:
    for number, record in enumerate(records):
        where = f"split {quoted(split)} shard {number}"
        if not isinstance(record, dict) or not {"file", "tokens", "sha256"} <= set(record):
            raise DataError(f"{path}: expected {where} to be an object with file, tokens and sha256")
        match = SHARD_FILE.fullmatch(record["file"]) if isinstance(record["file"], str) else None
        # The file must lie in its split's folder: an index is no way to read any other file.
        if match is None or match["split"] != split:
            raise DataError(
                f"{path}: expected the file of {where} to be '{split}/shard_NNNNN.bin', "
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


def open_shard(
    index_path: Path, record: dict[str, Any], dtype: np.dtype, verify: bool
) -> np.memmap:
    path = _shard_size(index_path, record, dtype)
    tokens = np.memmap(path, dtype=dtype, mode="r")
    if verify:
        check_checksum(index_path, record, tokens)
    return tokens


def check_checksum(index_path: Path, record: dict[str, Any], tokens: np.ndarray) -> None:
    if hashlib.sha256(tokens).hexdigest() != record["sha256"]:
        path = index_path.parent / record["file"]
        raise DataError(f"{path}: sha256 checksum differs from {index_path}: the shard is corrupt")
