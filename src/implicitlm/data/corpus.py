"""Text documents for language modelling, read from local files or a Hugging Face dataset.

A source is one of:

- a ``.jsonl`` file: one document per non-blank line, a JSON object with the text in ``text_field``;
- a ``.parquet`` file: one document per row of the column ``text_field``, read in record batches;
- any other file: the whole file is one document, its line endings kept (UTF-8; undecodable
  bytes become U+FFFD, as they do in JSONL);
- any of these but Parquet compressed with xz, gzip or bzip2 (``train.txt.xz``,
  ``docs.jsonl.gz``): read through the decompressor, the suffix before the compression's
  choosing the kind;
- a directory: the files below it whose names match ``pattern``, recursively, in sorted path
  order; hidden files and directories (names starting with ".") are skipped;
- a name that is not a local path, such as ``"allenai/c4"``: the Hugging Face dataset of that
  name, streamed (``datasets.load_dataset(name, split=split, streaming=True)``).

The order of documents depends only on the sources, so every reading gives the same sequence.
A malformed file raises a one-line ``DataError`` naming it (and the line or row).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import itertools
import lzma
import os
import re
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from implicitlm.core.errors import DataError, first_line
from implicitlm.core.json_file import check_regular, parse_json

Source = str | os.PathLike
# Suffixes that mark a source as a file path, so that a missing one is reported as missing
# rather than looked up on the hub.
FILE_SUFFIXES = {".txt", ".text", ".md", ".py", ".json", ".jsonl", ".parquet", ".csv", ".xz", ".gz", ".bz2"}
# Each compression's open(), which takes the same modes and text arguments as the builtin.
DECOMPRESSORS = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}
# "name" or "owner/name", as the hub spells dataset ids.
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
PARQUET_BATCH_ROWS = 1024


def read_documents(
    sources: Source | Iterable[Source],
    text_field: str = "text",
    split: str = "train",
    pattern: str = "*",
) -> Iterator[str]:
    """The documents of ``sources``, in order (see the module docstring for the kinds).

    Sources are checked at once, so a missing path raises here; file contents are read lazily.
    ``split`` applies to hub datasets only, ``pattern`` (a glob on file names) to directories.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    parts = [_source_documents(source, text_field, split, pattern) for source in sources]
    return itertools.chain.from_iterable(parts)


def _source_documents(source: Source, text_field: str, split: str, pattern: str) -> Iterator[str]:
    path = Path(source)
    if path.is_dir():
        files = _files_under(path, pattern)
        return itertools.chain.from_iterable(_file_documents(file, text_field) for file in files)
    if path.is_file():
        return _file_documents(path, text_field)
    check_regular(path, "a corpus file or folder")
    if _is_hub_name(source):
        return _hub_documents(str(source), text_field, split)
    raise DataError(f"{path}: no such file or directory")


def _is_hub_name(source: Source) -> bool:
    return (
        isinstance(source, str)
        and HUB_NAME.fullmatch(source) is not None
        and Path(source).suffix.lower() not in FILE_SUFFIXES
    )


def _files_under(directory: Path, pattern: str) -> list[Path]:
    # Version-control and editor metadata live in hidden paths; they are not documents.
    files = sorted(
        path
        for path in directory.rglob(pattern)
        if path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(directory).parts)
    )
    if not files:
        raise DataError(f"{directory}: no files match {pattern!r}")
    return files


def _file_documents(path: Path, text_field: str) -> Iterator[str]:
    compressed = path.suffix.lower() in DECOMPRESSORS
    kind = (Path(path.stem) if compressed else path).suffix.lower()
    with reading(path):
        if kind == ".jsonl":
            for where, record in jsonl_records(path):
                yield _text_of(record, text_field, where)
        elif kind == ".parquet":
            if compressed:  # Parquet compresses inside the file and needs to seek in it
                raise DataError(f"{path}: compressed Parquet is not read; Parquet compresses its own columns")
            yield from _parquet_documents(path, text_field)
        else:
            # Bytes decoded as they are: read_text would also turn "\r\n" into "\n".
            with DECOMPRESSORS.get(path.suffix.lower(), open)(path, "rb") as handle:
                yield handle.read().decode("utf-8", errors="replace")


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """Faults while reading ``path`` as one-line DataErrors. Files are read lazily, so one can
    vanish or lose its permissions after the sources were checked; a damaged compressed file
    raises OSError (gzip), LZMAError or EOFError (truncated)."""
    try:
        yield
    except (OSError, EOFError, lzma.LZMAError) as error:
        reason = getattr(error, "strerror", None) or first_line(error)
        raise DataError(f"{path}: cannot read ({reason})") from None


def open_text(path: Path) -> IO[str]:
    """``path`` as UTF-8 text (undecodable bytes become U+FFFD), decompressed by its suffix."""
    return DECOMPRESSORS.get(path.suffix.lower(), open)(path, "rt", encoding="utf-8", errors="replace")


def jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    """(``"path:line"``, parsed value) for each non-blank line of a JSONL file, compressed or not;
    use inside ``reading(path)``."""
    with open_text(path) as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            yield f"{path}:{line_number}", parse_json(line, path, "a JSON object", line_number)


def _parquet_documents(path: Path, text_field: str) -> Iterator[str]:
    try:
        parquet = pq.ParquetFile(path)
        columns = parquet.schema_arrow.names
        if text_field not in columns:
            raise DataError(f"{path}: expected a column {text_field!r}, found {columns}")
        batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[text_field])
        texts = itertools.chain.from_iterable(batch.column(0).to_pylist() for batch in batches)
        for row_number, text in enumerate(texts, 1):
            if not isinstance(text, str):
                raise DataError(
                    f"{path}: row {row_number}: expected a string in column {text_field!r}, "
                    f"got {type(text).__name__}"
                )
            yield text
    # pyarrow reports a damaged file with its own errors and with OSError, and damaged
    # string data as a UnicodeDecodeError when it becomes Python text.
    except (pa.ArrowException, OSError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: cannot read as Parquet: {first_line(error)}") from None


def _hub_documents(name: str, text_field: str, split: str) -> Iterator[str]:
    for row_number, row in enumerate(_hub_rows(name, split), 1):
        yield _text_of(row, text_field, f"{name}: row {row_number}")


def _hub_rows(name: str, split: str) -> Iterator[dict[str, Any]]:
    # Imported here: it takes seconds and only hub sources need it.
    import datasets

    try:
        yield from datasets.load_dataset(name, split=split, streaming=True)
    # The hub fails in many ways (network, authentication, unknown dataset or split), with
    # exception types that differ between library versions; all of them end reading here.
    except Exception as error:
        raise DataError(
            f"{name}: not a local path, and reading it as a Hugging Face dataset failed: "
            f"{first_line(error)}"
        ) from error


def _text_of(record: Any, text_field: str, where: str) -> str:
    text = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise DataError(f"{where}: expected an object with a string field {text_field!r}")
    return text
