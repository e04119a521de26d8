"""Word problems: random words over a finite group or monoid, labelled by prefix products.

Labels are aligned with the inputs: ``targets[:, t] = inputs[:, 0] * ... * inputs[:, t]``
(label t includes token t; there is no shift).

Storage: any path not ending in ``.csv`` holds one ``.npy`` array, read back
memory-mapped, with its metadata in a JSON sidecar ``path + '.json'``. With stored
targets (the default) the array has shape ``(2, count, length)`` (inputs, targets); with
derived targets (sidecar ``"targets": "derived"``) it holds only the inputs,
``(count, length)``, half the size, and the targets are computed from the rows read. A
sidecar without the key means stored targets. A ``.csv`` path uses the format of "The
Illusion of State" (Merrill et al., 2024): header ``seed,input,target``, one word per
row, elements space-separated. Every write goes to a temporary file that replaces the
target only once complete; the two files of ``.npy`` storage are both written whole
before either replaces its target.

Reading checks everything a file could get wrong (the metadata's fields and types, the
array's dtype and shape, every element index) and raises a one-line ``DataError`` naming
the file, and the line for CSV.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from tqdm.auto import tqdm

from implicitlm.core.atomic_io import atomic_write
from implicitlm.core.errors import DataError, check_header, check_int, first_line, not_utf8, quoted
from implicitlm.data.groups import FiniteAlgebra, resolve_group, smallest_uint_dtype
from implicitlm.core.json_file import check_regular, read_json_object

FORMAT_VERSION = 1
CSV_HEADER = ("seed", "input", "target")
TARGET_STORAGE = ("stored", "derived")
# Words are generated and checked in row blocks of about this many tokens, so temporary
# memory stays bounded however many words are requested.
BLOCK_TOKENS = 2**22
NPY_MAGIC = b"\x93NUMPY"
# A CSV seed of more digits is refused: int() would refuse thousands of them anyway.
MAX_CSV_DIGITS = 30


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
            raise ValueError("derived targets are computed: they cannot be read without a copy")
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
    _check_generation_args(algebra, length, count, seed, hard_prob)
    dtype = smallest_uint_dtype(algebra.order)
    try:
        inputs = np.empty((count, length), dtype=dtype)
        targets = np.empty((count, length), dtype=dtype)
    except (MemoryError, ValueError):
        raise ValueError(
            f"{count} words of length {length} are too many to hold in memory; "
            f"generate them to a .npy file instead"
        ) from None
    _fill_words(algebra, inputs, targets, seed, hard_prob)
    return inputs, targets


def write_generated_words(
    path: str | os.PathLike,
    group: str | FiniteAlgebra,
    length: int,
    count: int,
    seed: int = 0,
    hard_prob: float | None = None,
    progress: bool = False,
    targets: str = "stored",
) -> WordData:
    """Same data as ``generate_words``, generated straight into a memory-mapped file.

    ``targets="derived"`` stores only the inputs (half the size, and no products to
    compute here); reading derives the targets. The words are the same either way.
    """
    path = Path(path)
    _check_file_target(path)
    if path.suffix == ".csv":
        raise ValueError(f"{path}: generate to .npy storage; export CSV with save_words")
    if targets not in TARGET_STORAGE:
        raise ValueError(f"targets must be one of {', '.join(TARGET_STORAGE)}, got {targets!r}")
    algebra = resolve_group(group)
    _check_generation_args(algebra, length, count, seed, hard_prob)
    meta = _full_meta(algebra, count, length, seed, hard_prob)
    derived = targets == "derived"
    if derived:
        meta["targets"] = "derived"

    def fill(array: np.ndarray) -> None:
        inputs, products = (array, None) if derived else (array[0], array[1])
        _fill_words(algebra, inputs, products, seed, hard_prob, progress)

    shape = (count, length) if derived else (2, count, length)
    dtype = smallest_uint_dtype(algebra.order)
    _check_free_space(path, int(np.prod(shape, dtype=object)) * dtype.itemsize)
    _write_npy(path, shape, dtype, fill, meta)
    return load_words(path)


def prefix_products(group: str | FiniteAlgebra, inputs: np.ndarray) -> np.ndarray:
    """Running products of each row of ``inputs`` (shape (count, length)), whose entries
    must be element indices of ``group``."""
    algebra = resolve_group(group)
    _check_element_array(algebra, inputs)
    targets = np.empty(inputs.shape, dtype=smallest_uint_dtype(algebra.order))
    if inputs.shape[1] == 0:
        return targets
    targets[:, 0] = inputs[:, 0]
    # Sequential over positions by nature; each step is vectorised over all words.
    for t in range(1, inputs.shape[1]):
        targets[:, t] = algebra.table[targets[:, t - 1], inputs[:, t]]
    return targets


def verify_targets(group: str | FiniteAlgebra, inputs: np.ndarray, targets: np.ndarray) -> bool:
    """Whether ``targets`` are the prefix products of ``inputs`` (all in range)."""
    algebra = resolve_group(group)
    if inputs.shape != targets.shape or inputs.ndim != 2:
        return False
    for rows in _row_blocks(inputs.shape[0], inputs.shape[1]):
        block = np.asarray(inputs[rows])
        if not _are_elements(algebra, block):
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


def save_words(
    path: str | os.PathLike, inputs: np.ndarray, targets: np.ndarray, meta: dict[str, Any]
) -> None:
    """Write words atomically: CSV for a ``.csv`` path, else ``.npy`` plus JSON sidecar.

    ``meta`` must name the ``group``; a CSV export also needs the generation ``seed``.
    Length, count and format version are filled in from the arrays.
    """
    path = Path(path)
    _check_file_target(path)
    if not isinstance(meta, dict) or "group" not in meta:
        raise ValueError(f"{path}: meta must be a dict naming the 'group' of the words")
    algebra = resolve_group(meta["group"])
    # What is saved here has stored targets, even if it was read from a derived file.
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    _check_storable(path, algebra, inputs, targets)
    seed, hard_prob = meta.get("seed"), meta.get("hard_prob")
    _check_seed_and_hard_prob(path, seed, hard_prob, ValueError)
    count, length = inputs.shape
    full_meta = {
        **{key: value for key, value in meta.items() if key != "targets"},
        **_full_meta(algebra, count, length, seed, hard_prob),
    }
    try:
        json.dumps(full_meta)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: meta must hold only JSON values: {error}") from None
    if path.suffix == ".csv":
        _save_csv(path, inputs, targets, full_meta)
        return

    def fill(stacked: np.ndarray) -> None:
        stacked[0] = inputs
        stacked[1] = targets

    _write_npy(path, (2, count, length), smallest_uint_dtype(algebra.order), fill, full_meta)


def load_words(path: str | os.PathLike, group: str | FiniteAlgebra | None = None) -> WordData:
    """Read words written by ``save_words``; a CSV file needs its ``group`` given."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: expected a word file, got a directory")
    check_regular(path, "a word file")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix == ".csv":
        if group is None:
            raise ValueError(f"{path}: a CSV file does not name its group; pass group=")
        return _load_csv(path, resolve_group(group))
    return _load_npy(path, None if group is None else resolve_group(group))


def sidecar_path(path: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(path)}.json")


def _check_generation_args(
    algebra: FiniteAlgebra, length: int, count: int, seed: int, hard_prob: float | None
) -> None:
    for name, value in (("length", length), ("count", count)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if hard_prob is None:
        return
    if len(algebra.factor_orders) < 2:
        raise ValueError(
            f"hard_prob needs a direct product such as 'A5xM', "
            f"got the single factor {algebra.name!r}"
        )
    if not _is_probability(hard_prob):
        raise ValueError(f"hard_prob must lie in [0, 1], got {hard_prob!r}")


def _is_probability(value: Any) -> bool:
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and 0.0 <= value <= 1.0
    )


def _check_seed_and_hard_prob(source: object, seed: Any, hard_prob: Any, error: type[ValueError]) -> None:
    """Metadata fields: a non-negative integer seed and a probability, each or None."""
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
    ):
        raise error(f"{source}: expected 'seed' to be a non-negative integer or null, got {quoted(seed)}")
    if hard_prob is not None and not _is_probability(hard_prob):
        raise error(f"{source}: expected 'hard_prob' to be a number in [0, 1] or null, got {quoted(hard_prob)}")


def _check_file_target(path: Path) -> None:
    targets = [path] if path.suffix == ".csv" else [path, sidecar_path(path)]
    for target in targets:
        if target.is_dir():
            raise ValueError(f"{target}: is a directory; expected a path for a word file")


def _check_free_space(path: Path, size: int) -> None:
    """Refuse at once a file the disk cannot hold, rather than failing once it is full."""
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if size > free:
        raise ValueError(f"{path}: the words need {size:,} bytes, but only {free:,} are free there")


def _are_elements(algebra: FiniteAlgebra, block: np.ndarray) -> bool:
    """Whether every entry of ``block`` is an element index of ``algebra``."""
    if block.dtype.kind not in "ui":
        return False
    if not block.size or (block.dtype.kind == "u" and np.iinfo(block.dtype).max < algebra.order):
        return True  # every value of the dtype is an element
    return int(block.min()) >= 0 and int(block.max()) < algebra.order


def _check_element_array(algebra: FiniteAlgebra, inputs: np.ndarray) -> None:
    if not isinstance(inputs, np.ndarray) or inputs.ndim != 2 or inputs.dtype.kind not in "ui":
        raise ValueError(
            f"expected a 2-D integer array of words, got {type(inputs).__name__} "
            f"{getattr(inputs, 'dtype', '')} {getattr(inputs, 'shape', '')}".rstrip()
        )
    if not _are_elements(algebra, inputs):
        raise ValueError(f"expected element indices in [0, {algebra.order}) for {algebra.name}")


def _fill_words(
    algebra: FiniteAlgebra,
    inputs: np.ndarray,
    targets: np.ndarray | None,
    seed: int,
    hard_prob: float | None,
    progress: bool = False,
) -> None:
    rng = np.random.default_rng(seed)
    count, length = inputs.shape
    blocks = list(_row_blocks(count, length))
    for rows in tqdm(blocks, desc="generate", unit="block", disable=not progress or len(blocks) < 2):
        tokens = _sample_tokens(algebra, rng, (rows.stop - rows.start, length), hard_prob)
        inputs[rows] = tokens
        if targets is not None:
            targets[rows] = prefix_products(algebra, tokens)


def _row_blocks(count: int, length: int) -> Iterator[slice]:
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


def _full_meta(
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


def _check_storable(
    path: Path, algebra: FiniteAlgebra, inputs: np.ndarray, targets: np.ndarray
) -> None:
    if inputs.ndim != 2 or inputs.shape != targets.shape or 0 in inputs.shape:
        raise ValueError(
            f"{path}: inputs and targets must be non-empty (count, length) arrays of one shape, "
            f"got {inputs.shape} and {targets.shape}"
        )
    for name, array in (("inputs", inputs), ("targets", targets)):
        if not np.issubdtype(array.dtype, np.integer) or not _are_elements(algebra, array):
            raise ValueError(
                f"{path}: {name} must be integers in [0, {algebra.order}) for {algebra.name}"
            )


def _write_npy(
    path: Path,
    shape: tuple[int, ...],
    dtype: np.dtype,
    fill: Callable[[np.ndarray], None],
    meta: dict[str, Any],
) -> None:
    def write_array(temporary: Path) -> None:
        array = np.lib.format.open_memmap(temporary, mode="w+", dtype=dtype, shape=shape)
        fill(array)
        array.flush()
        del array

    # Both files are staged whole before either replaces its target, so that a failure
    # while writing leaves the old pair as it was. Data first: a reader that finds new
    # metadata therefore finds the new data.
    staged_array, staged_meta = _staged(path), _staged(sidecar_path(path))
    try:
        atomic_write(staged_array, write_array)
        atomic_write(staged_meta, lambda temporary: temporary.write_text(json.dumps(meta, indent=2)))
        os.replace(staged_array, path)
        os.replace(staged_meta, sidecar_path(path))
    finally:
        staged_array.unlink(missing_ok=True)
        staged_meta.unlink(missing_ok=True)


def _staged(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.staged")


def _load_npy(path: Path, group: FiniteAlgebra | None) -> WordData:
    meta, algebra = _read_meta(path)
    array = _open_npy(path)
    derived = meta.get("targets", "stored") == "derived"
    expected = (meta["count"], meta["length"]) if derived else (2, meta["count"], meta["length"])
    if array.shape != expected or not np.issubdtype(array.dtype, np.unsignedinteger):
        raise DataError(
            f"{path}: expected an unsigned array of shape {expected} as its metadata says, "
            f"got {array.dtype} {array.shape}"
        )
    if group is not None and group.name != algebra.name:
        raise DataError(f"{path}: holds words over {algebra.name}, not {group.name}")
    _check_stored_elements(path, algebra, array)
    if derived:
        return WordData(array, DerivedTargets(algebra, array), algebra.name, meta)
    return WordData(array[0], array[1], algebra.name, meta)


def _open_npy(path: Path) -> np.ndarray:
    # Checked first: np.load would take a zip file for an .npz archive, and other files
    # for pickles, which are never read.
    try:
        with open(path, "rb") as handle:
            magic = handle.read(len(NPY_MAGIC))
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror or type(error).__name__})") from None
    if magic != NPY_MAGIC:
        raise DataError(f"{path}: expected a .npy file, which begins {NPY_MAGIC!r}, got {magic!r}")
    try:
        with warnings.catch_warnings():
            # A damaged header can hold escapes that Python's parser warns about.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", SyntaxWarning)
            return np.load(path, mmap_mode="r", allow_pickle=False)
    # numpy parses the header with Python's tokenizer and ast, and reports a malformed header
    # or size with whatever those raise (ValueError, SyntaxError, TokenError, EOFError...).
    except Exception as error:
        raise DataError(f"{path}: cannot read as a .npy file: {first_line(error)}") from None


def _check_stored_elements(path: Path, algebra: FiniteAlgebra, array: np.ndarray) -> None:
    """Every entry of a stored array is an element index, and stored labels (a (2, count,
    length) array) are the running products of their inputs: one pass over the file. A
    label file that disagrees with its inputs would train and score against wrong answers."""
    count, length = array.shape[-2:]
    for rows in _row_blocks(count, length):
        block = np.asarray(array[..., rows, :])
        if not _are_elements(algebra, block):
            raise DataError(
                f"{path}: expected element indices below {algebra.order} for {algebra.name}, "
                f"got {int(block.max())} in words {rows.start}-{rows.stop - 1}"
            )
        if block.ndim == 3:
            _check_labels(path, algebra, block[0], block[1], first_row=rows.start)


def _check_labels(path: Path, algebra: FiniteAlgebra, inputs: np.ndarray, labels: np.ndarray, first_row: int) -> None:
    wrong = np.flatnonzero((prefix_products(algebra, inputs) != labels).any(axis=1))
    if wrong.size:
        row = first_row + int(wrong[0])
        raise DataError(f"{path}: word {row}: the stored labels are not the running products of its inputs")


def _read_meta(path: Path) -> tuple[dict[str, Any], FiniteAlgebra]:
    """The sidecar's metadata, each field checked, and the algebra it names."""
    sidecar = sidecar_path(path)
    if not sidecar.exists():
        raise DataError(f"{path}: metadata file {sidecar} is missing")
    meta = read_json_object(sidecar, "word metadata")
    check_header(meta, ("group", "count", "length", "format_version"), FORMAT_VERSION, sidecar, "word metadata")
    try:
        algebra = resolve_group(meta["group"])
    except ValueError as error:
        raise DataError(f"{sidecar}: 'group': {error}") from None
    check_int(meta["count"], sidecar, "count", minimum=1)
    check_int(meta["length"], sidecar, "length", minimum=1)
    _check_seed_and_hard_prob(sidecar, meta.get("seed"), meta.get("hard_prob"), DataError)
    if meta.get("targets", "stored") not in TARGET_STORAGE:
        raise DataError(
            f"{sidecar}: expected 'targets' to be one of {', '.join(TARGET_STORAGE)}, "
            f"got {quoted(meta['targets'])}"
        )
    return meta, algebra


def _save_csv(path: Path, inputs: np.ndarray, targets: np.ndarray, meta: dict[str, Any]) -> None:
    seed = meta.get("seed")
    if not isinstance(seed, int):
        raise ValueError(
            f"{path}: a CSV export needs the integer generation 'seed' in meta, got {seed!r}"
        )

    def write(temporary: Path) -> None:
        with open(temporary, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(CSV_HEADER)
            for word, labels in zip(inputs, targets):
                writer.writerow(
                    (seed, " ".join(map(str, word.tolist())), " ".join(map(str, labels.tolist())))
                )

    atomic_write(path, write)


def _load_csv(path: Path, algebra: FiniteAlgebra) -> WordData:
    seeds: list[int] = []
    inputs: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    with open(path, "rb") as handle:
        reader = csv.reader(_utf8_lines(path, handle))
        try:
            header = next(reader, None)
            if header != list(CSV_HEADER):
                found = "an empty file" if header is None else quoted(",".join(header))
                raise DataError(f"{path}:1: expected header 'seed,input,target', got {found}")
            for row in reader:
                seed, word, labels = _parse_csv_row(path, reader.line_num, row, algebra)
                if inputs and word.size != inputs[0].size:
                    raise DataError(
                        f"{path}:{reader.line_num}: expected {inputs[0].size} elements per word "
                        f"like the first row, got {word.size}"
                    )
                seeds.append(seed)
                inputs.append(word)
                targets.append(labels)
        except csv.Error as error:
            raise DataError(f"{path}:{reader.line_num}: expected CSV: {error}") from None
    if not inputs:
        raise DataError(f"{path}:2: expected at least one row after the header, got none")
    dtype = smallest_uint_dtype(algebra.order)
    meta = _full_meta(
        algebra, len(inputs), inputs[0].size, seeds[0] if len(set(seeds)) == 1 else None, None
    )
    inputs_array, targets_array = np.stack(inputs).astype(dtype), np.stack(targets).astype(dtype)
    _check_labels(path, algebra, inputs_array, targets_array, first_row=0)
    return WordData(inputs_array, targets_array, algebra.name, meta)


def _utf8_lines(path: Path, handle: Any) -> Iterator[str]:
    """The lines of a binary file as text, so that a decoding fault names its line."""
    for number, raw in enumerate(handle, 1):
        try:
            # A spreadsheet's byte-order mark before the header is no part of it.
            yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as error:
            raise DataError(f"{path}:{number}: expected UTF-8 text: {not_utf8(error)}") from None


def _parse_csv_row(
    path: Path, line: int, row: list[str], algebra: FiniteAlgebra
) -> tuple[int, np.ndarray, np.ndarray]:
    if len(row) != len(CSV_HEADER):
        raise DataError(f"{path}:{line}: expected 3 columns seed,input,target, got {len(row)}")
    # int() alone would also take signs, underscores, spaces and other scripts' digits.
    seed_text = row[0]
    if not (seed_text.isascii() and seed_text.isdigit() and len(seed_text) <= MAX_CSV_DIGITS):
        raise DataError(f"{path}:{line}: expected a non-negative integer seed, got {quoted(seed_text)}")
    seed = int(seed_text)
    word = _parse_elements(path, line, "input", row[1], algebra)
    labels = _parse_elements(path, line, "target", row[2], algebra)
    if word.size != labels.size:
        raise DataError(
            f"{path}:{line}: expected input and target of equal length, "
            f"got {word.size} and {labels.size}"
        )
    return seed, word, labels


def _parse_elements(
    path: Path, line: int, column: str, text: str, algebra: FiniteAlgebra
) -> np.ndarray:
    tokens = text.split()
    if not tokens:
        raise DataError(f"{path}:{line}: expected at least one element index in {column}, got none")
    values = []
    for token in tokens:
        # str.isdigit alone accepts non-ASCII digits such as superscripts.
        if not (token.isascii() and token.isdigit()):
            raise DataError(
                f"{path}:{line}: expected non-negative integers in {column}, got {quoted(token)}"
            )
        # Compared as text first: int() refuses numbers of thousands of digits.
        digits = token.lstrip("0") or "0"
        if len(digits) > len(str(algebra.order)) or int(digits) >= algebra.order:
            raise DataError(
                f"{path}:{line}: expected {column} indices below {algebra.order} for "
                f"{algebra.name}, got {quoted(token)}"
            )
        values.append(int(digits))
    return np.array(values, dtype=np.int64)
