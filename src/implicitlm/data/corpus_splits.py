"""Which text of a corpus is trained on and which held out.

A document without text (``corpus.holds_text``: empty, or nothing but whitespace, control or
zero-width characters) counts for nothing: it is not written, and its characters are not
counted; the others keep their indices. Document ``i`` goes to the test split when a hash of
``(seed, i)`` falls below ``test_fraction``. If no document does, the last document is split
by lines: its last lines that hold ``test_fraction`` of the corpus's characters (at least one
line; never its first line) are the test split, and the lines before them a training
document. So a small corpus still gets a test split, and a corpus of one file (one document)
trains on most of it; a last document of one line is held out whole. The index then records
the split's ``held_out_tail``: the lines held out, and ``of`` how many. A corpus with a
held-out set of its own (WikiText's validation file) passes it as ``test_documents`` instead,
and every one of ``documents`` is trained on.

Of the document read last while no test document has been drawn, only the pieces from where
its held-out lines could still begin are held (about ``test_fraction`` of the characters
read, and a line): memory does not grow with a document.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from typing import Iterable, Iterator

from implicitlm.data.corpus import Document
from implicitlm.data.parallel_tokenize import Labelled


def assign_splits(
    documents: Iterable[Document], test_fraction: float, seed: int, held_out_tail: dict[str, int]
) -> Iterator[Labelled]:
    """The pieces of each document with text, labelled with its index and split, in order
    (see the module docstring); fills ``held_out_tail`` when the last document is split."""
    last: _LastDocument | None = None
    drawn_test = False
    characters = 0
    for index, document in enumerate(documents):
        if not document.has_text:
            continue
        split = "test" if _hashed_fraction(seed, index) < test_fraction else "train"
        if last is not None:
            yield from last.whole()
            last = None
        drawn_test = drawn_test or split == "test"
        if drawn_test or test_fraction == 0:
            yield from labelled(index, split, document.pieces())
            continue
        # Only the last document may be split: until another comes, this one may be it.
        last = _LastDocument(index, test_fraction)
        for piece in document.pieces():
            characters += len(piece)
            yield from last.add(piece, characters)
    if last is not None:
        yield from last.split(characters, held_out_tail)


def labelled(index: int, split: str, pieces: Iterable[str]) -> Iterator[Labelled]:
    """The pieces (at least one) of document ``index``, the last marked as its end."""
    previous = None
    for piece in pieces:
        if previous is not None:
            yield index, split, previous, False
        previous = piece
    yield index, split, previous, True


class _LastDocument:
    """The document read last while no document has been drawn for the test split, which is
    split by ``_tail_start`` if it stays the last. Its pieces are held from where its
    held-out lines could still begin; those before go on to the training split at once."""

    def __init__(self, index: int, test_fraction: float):
        self.index = index
        self.test_fraction = test_fraction
        self.held: list[str] = []
        self.held_from = 0  # where in the document the held pieces begin
        self.length = 0
        self.line_breaks = 0

    def add(self, piece: str, characters: int) -> Iterator[Labelled]:
        """Hold ``piece`` (with it, the corpus has had ``characters``); the held pieces that
        end before the held-out lines can begin go on to training."""
        self.held.append(piece)
        self.length += len(piece)
        self.line_breaks += piece.count("\n")
        # However the corpus goes on, the held-out lines begin at or after the last line
        # start that leaves the share of the characters read so far after it.
        line_start = self._last_line_start(self.length - math.ceil(self.test_fraction * characters))
        passed, end = 0, self.held_from
        for held in self.held:
            if end + len(held) > line_start:
                break
            passed, end = passed + 1, end + len(held)
        for held in self.held[:passed]:
            yield self.index, "train", held, False
        del self.held[:passed]
        self.held_from = end

    def _last_line_start(self, at_most: int) -> int:
        """The last start of a line after the first in the held pieces at or before ``at_most``;
        ``held_from`` when there is none."""
        starts = itertools.accumulate((len(held) for held in self.held[:-1]), initial=self.held_from)
        for held, start in reversed(list(zip(self.held, starts))):
            line_break = held.rfind("\n", 0, max(0, at_most - start))
            if line_break >= 0:
                return start + line_break + 1
        return self.held_from

    def whole(self) -> Iterator[Labelled]:
        """The rest of the document, to training: it was not the last."""
        return labelled(self.index, "train", self.held)

    def split(self, characters: int, held_out_tail: dict[str, int]) -> Iterator[Labelled]:
        """The rest of the last document: its held-out lines to the test split, the lines
        before them to training; fills ``held_out_tail`` unless it is held out whole."""
        text = "".join(self.held)
        start = _tail_start(text, math.ceil(self.test_fraction * characters), after_first_line=self.held_from > 0)
        before, after = _cut_pieces(self.held, start)
        if self.held_from + start:
            lines = self.line_breaks + (not text.endswith("\n"))
            held_out_tail.update(lines=_line_count(text[start:]), of=lines)
            # The training part ends here: an empty piece carries its eos when it was all passed on.
            yield from labelled(self.index, "train", before or [""])
        yield from labelled(self.index, "test", after)


def _cut_pieces(pieces: list[str], at: int) -> tuple[list[str], list[str]]:
    """``pieces`` in two at character ``at`` of their text: the piece that holds it is cut there."""
    before, after, position = [], [], 0
    for piece in pieces:
        if position + len(piece) <= at:
            before.append(piece)
        elif position >= at:
            after.append(piece)
        else:
            before.append(piece[: at - position])
            after.append(piece[at - position :])
        position += len(piece)
    return before, after


def _tail_start(text: str, characters: int, after_first_line: bool = False) -> int:
    """Where the shortest run of whole last lines of ``text`` with at least ``characters``
    characters starts, or the second line when even that run from it is shorter; 0 when
    ``text`` is one line. ``after_first_line``: ``text`` is the end of a document from a line
    after its first, so its own first line may be in the run."""
    start = len(text)
    while True:
        line_start = text.rfind("\n", 0, start - 1) + 1
        if line_start == 0 and not after_first_line:
            return 0 if start == len(text) else start
        start = line_start
        if start == 0 or len(text) - start >= characters:
            return start


def _line_count(text: str) -> int:
    """Lines, each ended by "\\n" but perhaps the last."""
    return text.count("\n") + (not text.endswith("\n"))


def given_splits(documents: Iterable[Document], test_documents: Iterable[Document]) -> Iterator[Labelled]:
    """The pieces of every training document with text, then of every held-out one, indexed
    on from the last."""
    splits = itertools.chain(
        zip(itertools.repeat("train"), documents), zip(itertools.repeat("test"), test_documents)
    )
    for index, (split, document) in enumerate(splits):
        if document.has_text:
            yield from labelled(index, split, document.pieces())


def _hashed_fraction(seed: int, index: int) -> float:
    """A number in [0, 1) that looks uniformly random but depends only on (seed, index)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64
