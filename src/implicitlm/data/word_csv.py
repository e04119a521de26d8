"""Words as CSV, the format of "The Illusion of State" (Merrill et al., 2024): header
``seed,input,target``, one word per row, elements space-separated."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from implicitlm.core.atomic_io import atomic_write
from implicitlm.core.errors import DataError, OptionError, not_utf8, quoted
from implicitlm.data.groups import FiniteAlgebra, smallest_uint_dtype
from implicitlm.data.words import WordData, check_labels, word_meta

CSV_HEADER = ("seed", "input", "target")
# A CSV seed of more digits is refused: int() would refuse thousands of them anyway.
MAX_CSV_DIGITS = 30


def save_csv(path: Path, inputs: np.ndarray, targets: np.ndarray, meta: dict[str, Any]) -> None:
    seed = meta.get("seed")
    if not isinstance(seed, int):
        raise OptionError(
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


def load_csv(path: Path, algebra: FiniteAlgebra) -> WordData:
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
    meta = word_meta(
        algebra, len(inputs), inputs[0].size, seeds[0] if len(set(seeds)) == 1 else None, None
    )
    inputs_array, targets_array = np.stack(inputs).astype(dtype), np.stack(targets).astype(dtype)
    check_labels(path, algebra, inputs_array, targets_array, first_row=0)
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
