"""Word problems: random words over a finite group or monoid, labelled by prefix products,
and ``WordData``, the form a word set is held in (its files: ``word_storage``).

Labels are aligned with the inputs: ``targets[:, t] = inputs[:, 0] * ... * inputs[:, t]``
(label t includes token t; there is no shift).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from tqdm.auto import tqdm

from implicitlm.core.errors import DataError, OptionError
from implicitlm.data.groups import FiniteAlgebra, resolve_group, smallest_uint_dtype

FORMAT_VERSION = 1
# Words are generated and checked in row blocks of about this many tokens, so temporary
# memory stays bounded however many words are requested.
BLOCK_TOKENS = 2**22
# Generated test words are drawn in tiles of every word's tokens at this many positions, each
# tile from its own seed, so that any window of positions is drawn without the ones before
# it. The first tile is drawn as ``generate_words`` draws a single row block: test words of
# up to this many tokens are the same as before tiles, as long as they fill one block.
TILE_POSITIONS = 8192


class DerivedTargets:
    """Read-only prefix products of ``inputs``, computed for the words indexed.

    Indexes like the inputs (``t[i]``, ``t[a:b]``, ``t[rows]``, ``t[rows, :k]``) and
    returns a fresh array. The first index picks whole words, because a word's products
    need all of its tokens. ``np.asarray(t)`` computes every word: for small files.
    """

    ndim = 2

    def __init__(self, group: str | FiniteAlgebra, inputs: np.ndarray) -> None:
        self.algebra = resolve_group(group)
        self.inputs = inputs

    @property
    def shape(self) -> tuple[int, int]:
        return self.inputs.shape

    @property
    def dtype(self) -> np.dtype:
        return self.inputs.dtype

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        words, columns = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        tokens = np.asarray(self.inputs[words])
        products = prefix_products(self.algebra, tokens.reshape(-1, self.shape[1]))
        return products.reshape(tokens.shape)[(..., *columns)]

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise OptionError("derived targets are computed: they cannot be read without a copy")
        products = self[:]
        return products if dtype is None else products.astype(dtype, copy=False)


@dataclass
class WordData:
    """Inputs and aligned prefix-product targets, shape (count, length); maybe memmaps,
    and ``targets`` a ``DerivedTargets`` for a file that does not store them."""

    inputs: np.ndarray
    targets: np.ndarray | DerivedTargets
    group: str
    meta: dict[str, Any] = field(default_factory=dict)


def generate_words(
    group: str | FiniteAlgebra,
    length: int,
    count: int,
    seed: int = 0,
    hard_prob: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random words of ``length`` tokens and their prefix products.

    Without ``hard_prob`` every token is uniform over the elements. With it (direct
    products only, e.g. ``A5xM``) the rule of Schöne et al. (2025) applies: with
    probability ``hard_prob`` the first factor's component is the identity, otherwise it
    is uniform over all of that factor (identity included); the other factors are
    uniform. So a token is "hard" (first component not the identity) with probability
    ``(1 - hard_prob) * (1 - 1/|G|)``. The data depend only on the arguments.
    """
    algebra = resolve_group(group)
    check_generation_args(algebra, length, count, seed, hard_prob)
    dtype = smallest_uint_dtype(algebra.order)
    try:
        inputs = np.empty((count, length), dtype=dtype)
        targets = np.empty((count, length), dtype=dtype)
    except (MemoryError, ValueError):
        raise OptionError(
            f"{count} words of length {length} are too many to hold in memory; "
            f"generate them to a .npy file instead"
        ) from None
    fill_words(algebra, inputs, targets, seed, hard_prob)
    return inputs, targets


def prefix_products(group: str | FiniteAlgebra, inputs: np.ndarray, before: np.ndarray | None = None) -> np.ndarray:
    """Running products of each row of ``inputs`` (shape (count, length)), whose entries
    must be element indices of ``group``; ``before``: each row's product of the tokens
    before these (a window of longer words), none by default."""
    algebra = resolve_group(group)
    _check_element_array(algebra, inputs)
    targets = np.empty(inputs.shape, dtype=smallest_uint_dtype(algebra.order))
    if inputs.shape[1] == 0:
        return targets
    targets[:, 0] = inputs[:, 0] if before is None else algebra.table[before, inputs[:, 0]]
    # Sequential over positions by nature; each step is vectorised over all words.
    for t in range(1, inputs.shape[1]):
        targets[:, t] = algebra.table[targets[:, t - 1], inputs[:, t]]
    return targets


def verify_targets(group: str | FiniteAlgebra, inputs: np.ndarray, targets: np.ndarray) -> bool:
    """Whether ``targets`` are the prefix products of ``inputs`` (all in range)."""
    algebra = resolve_group(group)
    if inputs.shape != targets.shape or inputs.ndim != 2:
        return False
    for rows in row_blocks(inputs.shape[0], inputs.shape[1]):
        block = np.asarray(inputs[rows])
        if not are_elements(algebra, block):
            return False
        if not np.array_equal(prefix_products(algebra, block), targets[rows]):
            return False
    return True


def hard_token_mask(group: str | FiniteAlgebra, inputs: np.ndarray) -> np.ndarray:
    """True where a token's first-factor component is not the identity.

    For a group that is not a direct product this is simply "token is not the identity".
    """
    algebra = resolve_group(group)
    rest_order = algebra.order // algebra.factor_orders[0]
    return np.asarray(inputs) // rest_order != algebra.identity


def check_generation_args(
    algebra: FiniteAlgebra, length: int, count: int, seed: int, hard_prob: float | None
) -> None:
    for name, value in (("length", length), ("count", count)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise OptionError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise OptionError(f"seed must be a non-negative integer, got {seed!r}")
    if hard_prob is None:
        return
    if len(algebra.factor_orders) < 2:
        raise OptionError(
            f"hard_prob needs a direct product such as 'A5xM', "
            f"got the single factor {algebra.name!r}"
        )
    if not is_probability(hard_prob):
        raise OptionError(f"hard_prob must lie in [0, 1], got {hard_prob!r}")


def is_probability(value: Any) -> bool:
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and 0.0 <= value <= 1.0
    )


def are_elements(algebra: FiniteAlgebra, block: np.ndarray) -> bool:
    """Whether every entry of ``block`` is an element index of ``algebra``."""
    if block.dtype.kind not in "ui":
        return False
    if not block.size or (block.dtype.kind == "u" and np.iinfo(block.dtype).max < algebra.order):
        return True  # every value of the dtype is an element
    return int(block.min()) >= 0 and int(block.max()) < algebra.order


def _check_element_array(algebra: FiniteAlgebra, inputs: np.ndarray) -> None:
    if not isinstance(inputs, np.ndarray) or inputs.ndim != 2 or inputs.dtype.kind not in "ui":
        raise OptionError(
            f"expected a 2-D integer array of words, got {type(inputs).__name__} "
            f"{getattr(inputs, 'dtype', '')} {getattr(inputs, 'shape', '')}".rstrip()
        )
    if not are_elements(algebra, inputs):
        raise OptionError(f"expected element indices in [0, {algebra.order}) for {algebra.name}")


def fill_words(
    algebra: FiniteAlgebra,
    inputs: np.ndarray,
    targets: np.ndarray | None,
    seed: int,
    hard_prob: float | None,
    progress: bool = False,
) -> None:
    rng = np.random.default_rng(seed)
    count, length = inputs.shape
    blocks = list(row_blocks(count, length))
    for rows in tqdm(blocks, desc="generate", unit="block", disable=not progress or len(blocks) < 2):
        tokens = _sample_tokens(algebra, rng, (rows.stop - rows.start, length), hard_prob)
        inputs[rows] = tokens
        if targets is not None:
            targets[rows] = prefix_products(algebra, tokens)


def row_blocks(count: int, length: int) -> Iterator[slice]:
    rows_per_block = max(1, BLOCK_TOKENS // max(1, length))
    for start in range(0, count, rows_per_block):
        yield slice(start, min(start + rows_per_block, count))


def _sample_tokens(
    algebra: FiniteAlgebra,
    rng: np.random.Generator,
    shape: tuple[int, int],
    hard_prob: float | None,
) -> np.ndarray:
    dtype = smallest_uint_dtype(algebra.order)
    if hard_prob is None:
        return rng.integers(0, algebra.order, size=shape, dtype=dtype)
    first_order = algebra.factor_orders[0]
    rest_order = algebra.order // first_order
    # Strictly greater, as in the reference generator: hard_prob = 1 never frees a token.
    free = rng.random(shape, dtype=np.float32) > hard_prob
    first = rng.integers(0, first_order, size=shape, dtype=dtype)
    first *= free
    rest = rng.integers(0, rest_order, size=shape, dtype=dtype)
    if first_order == 1:
        return rest  # rest_order == order might not fit the token dtype (e.g. Z1xZ256)
    # In place and in the token dtype, which holds first * rest_order + rest < order.
    first *= dtype.type(rest_order)
    first += rest
    return first


def word_meta(
    algebra: FiniteAlgebra, count: int, length: int, seed: int | None, hard_prob: float | None
) -> dict[str, Any]:
    return {
        "group": algebra.name,
        "length": int(length),
        "count": int(count),
        "seed": None if seed is None else int(seed),
        "hard_prob": None if hard_prob is None else float(hard_prob),
        "format_version": FORMAT_VERSION,
    }


def check_labels(path: Path, algebra: FiniteAlgebra, inputs: np.ndarray, labels: np.ndarray, first_row: int) -> None:
    wrong = np.flatnonzero((prefix_products(algebra, inputs) != labels).any(axis=1))
    if wrong.size:
        row = first_row + int(wrong[0])
        raise DataError(f"{path}: word {row}: the stored labels are not the running products of its inputs")


class WordWindows(ABC):
    """A word set read in windows of positions, left to right (from position 0 again for
    another pass): every word's tokens and labels at positions [start, end). Labels that are
    not stored are running products carried from one window to the next, so a window costs
    the memory of its own positions only, however long the words."""

    def __init__(self, count: int, length: int, token_bytes: int) -> None:
        self.count, self.length = count, length
        self.token_bytes = token_bytes  # of one token, and of one label, in a window
        self._read_to = 0
        self._last_labels: np.ndarray | None = None

    def window(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, labels) of every word at positions [start, end), each (count, end - start)."""
        if start not in (0, self._read_to) or not start < end <= self.length:
            raise OptionError(f"word windows are read left to right: positions [{start}, {end}) after {self._read_to}")
        tokens = self._tokens(start, end)
        labels = self._labels(start, end, tokens, None if start == 0 else self._last_labels)
        self._read_to, self._last_labels = end, labels[:, -1].copy()
        return tokens, labels

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of the whole words, in memory: for short words only."""
        return self.window(0, self.length)

    @abstractmethod
    def _tokens(self, start: int, end: int) -> np.ndarray:
        """Every word's tokens at positions [start, end)."""

    @abstractmethod
    def _labels(self, start: int, end: int, tokens: np.ndarray, before: np.ndarray | None) -> np.ndarray:
        """Every word's labels at positions [start, end), whose ``tokens`` follow tokens whose
        running products are ``before`` (None at position 0)."""


class GeneratedWords(WordWindows):
    """``count`` random words of ``length`` tokens drawn as ``generate_words`` draws them
    (``hard_prob`` likewise), tile by tile (``TILE_POSITIONS``) from ``seed``: the words
    depend on the arguments only, not on the windows they are read in."""

    def __init__(self, group: str | FiniteAlgebra, length: int, count: int, seed: int = 0, hard_prob: float | None = None):
        self.algebra = resolve_group(group)
        check_generation_args(self.algebra, length, count, seed, hard_prob)
        super().__init__(count, length, smallest_uint_dtype(self.algebra.order).itemsize)
        self.seed, self.hard_prob = seed, hard_prob
        self._last_tile: tuple[int, np.ndarray] | None = None

    @property
    def tile_bytes(self) -> int:
        """Memory of drawing one tile: its tokens and, with ``hard_prob``, the draws they are made of."""
        draws = 4 + 2 * self.token_bytes if self.hard_prob is not None else 0  # a float32 and two token draws
        return self.count * min(self.length, TILE_POSITIONS) * (self.token_bytes + draws)

    def _tokens(self, start: int, end: int) -> np.ndarray:
        first, last = start // TILE_POSITIONS, (end - 1) // TILE_POSITIONS
        tiles = [self._tile(index) for index in range(first, last + 1)]
        offset = first * TILE_POSITIONS
        return (tiles[0] if len(tiles) == 1 else np.concatenate(tiles, axis=1))[:, start - offset:end - offset]

    def _tile(self, index: int) -> np.ndarray:
        # Consecutive windows share a tile at their border: the last one is kept for the next.
        if self._last_tile is None or self._last_tile[0] != index:
            seed = np.random.SeedSequence(self.seed) if index == 0 else np.random.SeedSequence(self.seed, spawn_key=(index,))
            width = min(TILE_POSITIONS, self.length - index * TILE_POSITIONS)
            tokens = _sample_tokens(self.algebra, np.random.default_rng(seed), (self.count, width), self.hard_prob)
            self._last_tile = (index, tokens)
        return self._last_tile[1]

    def _labels(self, start: int, end: int, tokens: np.ndarray, before: np.ndarray | None) -> np.ndarray:
        return prefix_products(self.algebra, tokens, before)


class StoredWords(WordWindows):
    """Words held in arrays or memory-mapped files, with their labels (``WordData``'s
    inputs and targets), read a window at a time."""

    def __init__(self, inputs: np.ndarray, targets: np.ndarray | DerivedTargets):
        if inputs.ndim != 2 or targets.shape != inputs.shape:
            raise OptionError(f"expected inputs and targets of one shape (count, length), got {inputs.shape} and {targets.shape}")
        super().__init__(int(inputs.shape[0]), int(inputs.shape[1]), inputs.dtype.itemsize)
        self.inputs, self.targets = inputs, targets

    def _tokens(self, start: int, end: int) -> np.ndarray:
        return np.asarray(self.inputs[:, start:end])

    def _labels(self, start: int, end: int, tokens: np.ndarray, before: np.ndarray | None) -> np.ndarray:
        # Derived targets would compute each word's labels from all its tokens: carried here instead.
        if isinstance(self.targets, DerivedTargets):
            return prefix_products(self.targets.algebra, tokens, before)
        return np.asarray(self.targets[:, start:end])
