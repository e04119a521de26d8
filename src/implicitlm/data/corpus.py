"""Text documents for language modelling, read from local files or a Hugging Face dataset.

A source is one of:

- a ``.jsonl`` file: one document per non-blank line, a JSON object with the text in ``text_field``;
- a ``.parquet`` file: one document per row of the column ``text_field``, read in record batches;
- any other file: the whole file is one document, its line endings kept;
- any of these but Parquet compressed with xz, gzip or bzip2 (``train.txt.xz``,
  ``docs.jsonl.gz``): read through the decompressor, the suffix before the compression's
  choosing the kind;
- a directory: the files below it whose names match ``pattern``, recursively, in sorted path
  order; hidden files and directories (names starting with ".") are skipped;
- a name that is not a local path, such as ``"allenai/c4"``: the Hugging Face dataset of that
  name, streamed (``datasets.load_dataset(name, split=split, streaming=True)``).

Text and JSONL files are UTF-8: a byte that is not raises a ``DataError`` naming the file and
line, unless ``errors="replace"`` asks for U+FFFD in its place (``Documents`` counts them).
Files are read a line at a time, and a line of more than ``MAX_LINE_BYTES`` is refused before
it is held whole.

A document is read as pieces of text (``text_pieces``) of a bounded size, so that a file of
any length is tokenized in bounded memory; ``Documents.streamed`` gives each document as a
``Document`` that yields them. A document has text when it holds a character that is neither
whitespace nor a control or format character (``holds_text``): an empty file, a file of
blank lines, byte order marks or zero-width spaces, a JSONL or Parquet text of them, has none.

The order of documents depends only on the sources, so every reading gives the same sequence.
A malformed file raises a one-line ``DataError`` naming it (and the line or row).
"""

from __future__ import annotations

import bz2
import contextlib
import filecmp
import functools
import gzip
import itertools
import lzma
import os
import re
import sys
import unicodedata
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from implicitlm.core.errors import DataError, OptionError, first_line, not_utf8
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
# The longest line of a text or JSONL file that is read: far more than text has, and few
# enough bytes to hold (a one-line file of gigabytes is refused here, not in the tokenizer).
MAX_LINE_BYTES = 2**24
# A document's text is tokenized in pieces of this many characters to twice as many: a
# fast tokenizer takes a few hundred bytes of memory per character it is handed at once.
PIECE_CHARACTERS = 2**16
# Where a piece may end so that a byte-level BPE (GPT-2's word pattern) splits the text into
# the same words as uncut: after a line break, or before a space, between characters that
# are not whitespace. A piece ends elsewhere only after twice PIECE_CHARACTERS without one.
LINE_CUT = re.compile(r"(?<=\S\n)(?=\S)")
WORD_CUT = re.compile(r"(?<=\S)(?= \S)")
DECODE_ERRORS = ("strict", "replace")
# A line of a file as text: (the line's bytes, the file, the line's number) -> str.
Decoder = Callable[[bytes, Path, int], str]


def read_documents(
    sources: Source | Iterable[Source],
    text_field: str = "text",
    split: str = "train",
    pattern: str = "*",
    errors: str = "strict",
    require_text: bool = False,
) -> Documents:
    """The documents of ``sources``, in order (see the module docstring for the kinds).

    Sources are checked at once, so a missing path raises here; file contents are read lazily.
    ``split`` applies to hub datasets only, ``pattern`` (a glob on file names) to directories.
    ``errors="replace"`` reads bytes that are not UTF-8 as U+FFFD instead of refusing the
    file. ``require_text`` refuses a source without text (see ``holds_text``) when it has
    been read.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    return Documents(sources, text_field, split, pattern, errors, require_text)


def check_held_out_apart(sources: Iterable[Source], test_sources: Iterable[Source], pattern: str = "*") -> None:
    """Refuse, in one line, a held-out source that is (or holds, or lies in) one of the
    training ``sources``: its text would be trained on and then scored as unseen. Files are
    compared as the readers list them (``pattern`` in folders, links resolved), and by their
    bytes (a copy); a hub dataset, by its name."""
    trained = {entry: source for source in sources for entry in _read_entries(source, pattern)}
    # A copy of a training file holds its text too: compared byte for byte, only with the
    # training files of its size, so that a corpus is not read twice.
    by_size: dict[int, list[Path]] = {}
    for entry in trained:
        if isinstance(entry, Path):
            by_size.setdefault(entry.stat().st_size, []).append(entry)
    for source in test_sources:
        for entry in _read_entries(source, pattern):
            if entry in trained:
                raise OptionError(
                    f"{source}: in test_sources, but the training source {trained[entry]} reads {entry} too: "
                    f"its text would be trained on and scored as held out", arguments=("test_sources",),
                )
            same = isinstance(entry, Path) and next(
                (file for file in by_size.get(entry.stat().st_size, []) if filecmp.cmp(entry, file, shallow=False)), None)
            if same:
                raise OptionError(
                    f"{source}: in test_sources, but {entry} holds the same bytes as {same}, which the training "
                    f"source {trained[same]} reads: its text would be trained on and scored as held out",
                    arguments=("test_sources",),
                )


def _read_entries(source: Source, pattern: str) -> list[Path | str]:
    path = Path(source)
    if path.is_dir():
        return [file.resolve() for file in _files_under(path, pattern)]
    return [path.resolve()] if path.is_file() else [str(source)]


class Documents(Iterator[str]):
    """The documents of some sources (see ``read_documents``), read as they are iterated, each
    as one string; ``streamed`` gives them as ``Document``s instead, ``pieces`` as pieces of
    text (for memory that does not grow with a document's length). Counts the undecodable
    bytes read so far that ``errors="replace"`` replaced, and their lines."""

    def __init__(
        self,
        sources: Iterable[Source],
        text_field: str,
        split: str,
        pattern: str,
        errors: str,
        require_text: bool,
    ):
        if errors not in DECODE_ERRORS:
            raise OptionError(f"errors must be one of {', '.join(DECODE_ERRORS)}, got {errors!r}")
        self.errors = errors
        self.replaced_bytes = 0
        self.replaced_lines = 0
        sources = list(sources)
        parts = [_source_documents(source, text_field, split, pattern, self.decode) for source in sources]
        if require_text:
            parts = [_with_text(source, part) for source, part in zip(sources, parts)]
        self._documents = itertools.chain.from_iterable(parts)

    def __next__(self) -> str:
        return "".join(next(self._documents).pieces())

    def streamed(self) -> Iterator[Document]:
        """The documents not yet read, as ``Document``s."""
        return self._documents

    def pieces(self) -> Iterator[str]:
        """The text of the documents not yet read, in pieces (``text_pieces``)."""
        return itertools.chain.from_iterable(document.pieces() for document in self._documents)

    def decode(self, line: bytes, path: Path, line_number: int) -> str:
        """Line ``line_number`` of the file ``path`` as text, by ``errors``."""
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as error:
            if self.errors == "strict":
                raise DataError(
                    f"{path}:{line_number}: {not_utf8(error)}; errors='replace' reads such bytes as U+FFFD",
                    arguments=("errors",),
                ) from None
        # surrogateescape turns each undecodable byte, and only those, into a lone surrogate.
        escaped = line.decode("utf-8", errors="surrogateescape")
        self.replaced_bytes += sum(1 for char in escaped if "\udc80" <= char <= "\udcff")
        self.replaced_lines += 1
        return line.decode("utf-8", errors="replace")


class Document:
    """One document's text, read in pieces (``text_pieces``) each time ``pieces`` is called,
    from ``chunks``: its lines, or its whole text, decoded by the decoder it is given."""

    def __init__(self, chunks: Callable[[Decoder], Iterable[str]], decode: Decoder):
        self._chunks = chunks
        self._decode = decode

    @classmethod
    def of_text(cls, text: str) -> Document:
        return cls(lambda decode: (text,), _replacing)

    def pieces(self) -> Iterator[str]:
        return text_pieces(self._chunks(self._decode))

    @functools.cached_property
    def has_text(self) -> bool:
        """Whether the document holds text (``holds_text``); read apart from ``pieces``, with
        undecodable bytes as U+FFFD: ``pieces`` refuses or counts them when it reads them."""
        return any(map(holds_text, self._chunks(_replacing)))


def holds_text(text: str) -> bool:
    """Whether ``text`` has a character that is text: one that is not whitespace, nor a control
    character, nor a format character that shows nothing (a byte order mark, a zero-width
    space or joiner, a direction mark)."""
    return _text_character().search(text) is not None


@functools.cache
def _text_character() -> re.Pattern[str]:
    invisible = "".join(
        chr(code) for code in range(sys.maxunicode + 1) if unicodedata.category(chr(code)) in ("Cc", "Cf")
    )
    return re.compile(f"[^\\s{re.escape(invisible)}]")


def text_pieces(chunks: Iterable[str]) -> Iterator[str]:
    """The text of ``chunks`` again, in pieces of PIECE_CHARACTERS to twice as many characters,
    the last perhaps shorter ("" when there is no text), each ending where LINE_CUT, else
    WORD_CUT, finds a place, else after PIECE_CHARACTERS."""
    held: list[str] = []
    length = 0
    for chunk in chunks:
        held.append(chunk)
        length += len(chunk)
        if length < 2 * PIECE_CHARACTERS:
            continue
        text, start = "".join(held), 0
        while len(text) - start >= 2 * PIECE_CHARACTERS:
            end = _piece_end(text, start)
            yield text[start:end]
            start = end
        held, length = [text[start:]], len(text) - start
    yield "".join(held)


def _piece_end(text: str, start: int) -> int:
    window = (start + PIECE_CHARACTERS, start + 2 * PIECE_CHARACTERS)
    cut = LINE_CUT.search(text, *window) or WORD_CUT.search(text, *window)
    return cut.start() if cut else window[0]


def _with_text(source: Source, documents: Iterator[Document]) -> Iterator[Document]:
    """``documents``, then a DataError if none of them held text: a source without text
    would otherwise give a tokenizer of bare bytes, or shards of nothing but eos."""
    empty = True
    for document in documents:
        empty = empty and not document.has_text
        yield document
    if empty:
        raise DataError(
            f"{source}: no text in it (an empty file, or only whitespace, control or zero-width characters, "
            f"or only empty documents)"
        )


def _source_documents(
    source: Source, text_field: str, split: str, pattern: str, decode: Decoder
) -> Iterator[Document]:
    path = Path(source)
    if path.is_dir():
        files = _files_under(path, pattern)
        return itertools.chain.from_iterable(_file_documents(file, text_field, decode) for file in files)
    if path.is_file():
        return _file_documents(path, text_field, decode)
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


def _file_documents(path: Path, text_field: str, decode: Decoder) -> Iterator[Document]:
    compressed = path.suffix.lower() in DECOMPRESSORS
    kind = (Path(path.stem) if compressed else path).suffix.lower()
    with reading(path):
        if kind == ".jsonl":
            for where, record in jsonl_records(path, decode):
                yield Document.of_text(_text_of(record, text_field, where))
        elif kind == ".parquet":
            if compressed:  # Parquet compresses inside the file and needs to seek in it
                raise DataError(f"{path}: compressed Parquet is not read; Parquet compresses its own columns")
            yield from map(Document.of_text, _parquet_documents(path, text_field))
        else:
            yield Document(functools.partial(_text_lines, path), decode)


def _text_lines(path: Path, decode: Decoder) -> Iterator[str]:
    # Bytes decoded as they are, since read_text would also turn "\r\n" into "\n"; line by
    # line, so that an undecodable byte is named by its line.
    with reading(path):
        for line_number, line in _lines(path):
            yield decode(line, path, line_number)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(number, bytes) of each line of a file, compressed or not; use inside ``reading(path)``."""
    with _open_binary(path) as handle:
        for line_number, line in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES:
                raise DataError(
                    f"{path}:{line_number}: a line of more than {MAX_LINE_BYTES:,} bytes, which is not read; "
                    f"break the text into lines"
                )
            yield line_number, line


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


def _open_binary(path: Path) -> IO[bytes]:
    return DECOMPRESSORS.get(path.suffix.lower(), open)(path, "rb")


def _replacing(line: bytes, path: Path, line_number: int) -> str:
    return line.decode("utf-8", errors="replace")


def jsonl_records(path: Path, decode: Decoder = _replacing) -> Iterator[tuple[str, Any]]:
    """(``"path:line"``, parsed value) for each non-blank line of a JSONL file, compressed or not,
    its lines decoded by ``decode`` (by default undecodable bytes become U+FFFD); use inside
    ``reading(path)``."""
    for line_number, raw in _lines(path):
        line = decode(raw, path, line_number)
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


def _hub_documents(name: str, text_field: str, split: str) -> Iterator[Document]:
    for row_number, row in enumerate(_hub_rows(name, split), 1):
        yield Document.of_text(_text_of(row, text_field, f"{name}: row {row_number}"))


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
