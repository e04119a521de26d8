"""Word files: writing words (``save_words``, or generated straight to disk with
``write_generated_words``) and reading them back (``load_words``).

Storage: any path not ending in ``.csv`` holds one ``.npy`` array, read back
memory-mapped, with its metadata in a JSON sidecar ``path + '.json'``. With stored
targets (the default) the array has shape ``(2, count, length)`` (inputs, targets); with
derived targets (sidecar ``"targets": "derived"``) it holds only the inputs,
``(count, length)``, half the size, and the targets are computed from the rows read. A
sidecar without the key means stored targets. A ``.csv`` path uses the format of
``word_csv``. Every write goes to a temporary file that replaces the target only once
complete; the two files of ``.npy`` storage are both written whole before either replaces
its target.

Reading checks everything a file could get wrong (the metadata's fields and types, the
array's dtype and shape, every element index) and raises a one-line ``DataError`` naming
the file, and the line for CSV.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from implicitlm.core.atomic_io import atomic_write
from implicitlm.core.errors import DataError, OptionError, check_header, check_int, closest_hint, first_line, quoted
from implicitlm.core.targets import exclusive_targets
from implicitlm.data.groups import FiniteAlgebra, resolve_group, smallest_uint_dtype
from implicitlm.core.json_file import check_regular, read_json_object
from implicitlm.data.word_csv import load_csv, save_csv
from implicitlm.data.words import (
    FORMAT_VERSION,
    DerivedTargets,
    WordData,
    are_elements,
    check_generation_args,
    check_labels,
    fill_words,
    generate_words,
    is_probability,
    row_blocks,
    word_meta,
)

TARGET_STORAGE = ("stored", "derived")
# What a sidecar holds: what ``word_meta`` writes, and "targets" for a file of derived targets.
REQUIRED_META_KEYS = ("group", "count", "length", "format_version")
META_KEYS = ("group", "seed", "hard_prob", "targets", "count", "length", "format_version")
NPY_MAGIC = b"\x93NUMPY"


def write_generated_words(
    path: str | os.PathLike,
    group: str | FiniteAlgebra,
    length: int,
    count: int,
    seed: int = 0,
    hard_prob: float | None = None,
    progress: bool = False,
    targets: str = "stored",
    overwrite: bool = False,
) -> WordData:
    """Same data as ``generate_words``, generated straight into a memory-mapped file, or, for a
    ``.csv`` path, written in the CSV format of *The Illusion of State* (generated in memory).

    ``targets="derived"`` stores only the inputs (half the size, and no products to
    compute here); reading derives the targets. The words are the same either way.
    A file already there (or, for ``.npy`` storage, its sidecar) is refused unless ``overwrite``.
    """
    path = Path(path)
    _check_file_target(path)
    with exclusive_targets(_file_targets(path), overwrite):
        return _write_generated(path, group, length, count, seed, hard_prob, progress, targets)


def _write_generated(
    path: Path, group: str | FiniteAlgebra, length: int, count: int, seed: int, hard_prob: float | None,
    progress: bool, targets: str,
) -> WordData:
    if path.suffix == ".csv":
        if targets != "stored":
            raise OptionError(f"{path}: targets={targets!r} needs .npy storage; CSV files store their targets")
        algebra = resolve_group(group)
        inputs, products = generate_words(algebra, length, count, seed, hard_prob)
        save_words(path, inputs, products, {"group": algebra.name, "seed": seed, "hard_prob": hard_prob})
        return load_words(path, algebra)
    if targets not in TARGET_STORAGE:
        raise OptionError(f"targets must be one of {', '.join(TARGET_STORAGE)}, got {targets!r}")
    algebra = resolve_group(group)
    check_generation_args(algebra, length, count, seed, hard_prob)
    meta = word_meta(algebra, count, length, seed, hard_prob)
    derived = targets == "derived"
    if derived:
        meta["targets"] = "derived"

    def fill(array: np.ndarray) -> None:
        inputs, products = (array, None) if derived else (array[0], array[1])
        fill_words(algebra, inputs, products, seed, hard_prob, progress)

    shape = (count, length) if derived else (2, count, length)
    dtype = smallest_uint_dtype(algebra.order)
    _check_free_space(path, int(np.prod(shape, dtype=object)) * dtype.itemsize)
    _write_npy(path, shape, dtype, fill, meta)
    return load_words(path)


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
        raise OptionError(f"{path}: meta must be a dict naming the 'group' of the words")
    for key in meta:
        if key not in META_KEYS:
            # The reader refuses keys it does not know, so none may be written.
            raise OptionError(f"{path}: unknown meta key {quoted(key)}{closest_hint(key, META_KEYS)}")
    algebra = resolve_group(meta["group"])
    # What is saved here has stored targets, even if it was read from a derived file.
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    _check_storable(path, algebra, inputs, targets)
    seed, hard_prob = meta.get("seed"), meta.get("hard_prob")
    _check_seed_and_hard_prob(path, seed, hard_prob, OptionError)
    count, length = inputs.shape
    full_meta = {
        **{key: value for key, value in meta.items() if key != "targets"},
        **word_meta(algebra, count, length, seed, hard_prob),
    }
    try:
        json.dumps(full_meta)
    except (TypeError, ValueError) as error:
        raise OptionError(f"{path}: meta must hold only JSON values: {error}") from None
    if path.suffix == ".csv":
        save_csv(path, inputs, targets, full_meta)
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
            raise OptionError(f"{path}: a CSV file does not name its group; pass group=")
        return load_csv(path, resolve_group(group))
    return _load_npy(path, None if group is None else resolve_group(group))


def sidecar_path(path: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(path)}.json")


def _check_seed_and_hard_prob(source: object, seed: Any, hard_prob: Any, error: type[DataError | OptionError]) -> None:
    """Metadata fields: a non-negative integer seed and a probability, each or None."""
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
    ):
        raise error(f"{source}: expected 'seed' to be a non-negative integer or null, got {quoted(seed)}")
    if hard_prob is not None and not is_probability(hard_prob):
        raise error(f"{source}: expected 'hard_prob' to be a number in [0, 1] or null, got {quoted(hard_prob)}")


def _file_targets(path: Path) -> list[Path]:
    """The files a word file is: ``.npy`` storage writes a JSON sidecar beside the array."""
    return [path] if path.suffix == ".csv" else [path, sidecar_path(path)]


def _check_file_target(path: Path) -> None:
    for target in _file_targets(path):
        if target.is_dir():
            raise OptionError(f"{target}: is a directory; expected a path for a word file")


def _check_free_space(path: Path, size: int) -> None:
    """Refuse at once a file the disk cannot hold, rather than failing once it is full."""
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if size > free:
        raise OptionError(f"{path}: the words need {size:,} bytes, but only {free:,} are free there")


def _check_storable(
    path: Path, algebra: FiniteAlgebra, inputs: np.ndarray, targets: np.ndarray
) -> None:
    if inputs.ndim != 2 or inputs.shape != targets.shape or 0 in inputs.shape:
        raise OptionError(
            f"{path}: inputs and targets must be non-empty (count, length) arrays of one shape, "
            f"got {inputs.shape} and {targets.shape}"
        )
    for name, array in (("inputs", inputs), ("targets", targets)):
        if not np.issubdtype(array.dtype, np.integer) or not are_elements(algebra, array):
            raise OptionError(
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
    for rows in row_blocks(count, length):
        block = np.asarray(array[..., rows, :])
        if not are_elements(algebra, block):
            raise DataError(
                f"{path}: expected element indices below {algebra.order} for {algebra.name}, "
                f"got {int(block.max())} in words {rows.start}-{rows.stop - 1}"
            )
        if block.ndim == 3:
            check_labels(path, algebra, block[0], block[1], first_row=rows.start)


def _read_meta(path: Path) -> tuple[dict[str, Any], FiniteAlgebra]:
    """The sidecar's metadata, each field checked, and the algebra it names."""
    sidecar = sidecar_path(path)
    if not sidecar.exists():
        raise DataError(f"{path}: metadata file {sidecar} is missing")
    meta = read_json_object(sidecar, "word metadata")
    check_header(meta, REQUIRED_META_KEYS, FORMAT_VERSION, sidecar, "word metadata", optional=META_KEYS)
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
