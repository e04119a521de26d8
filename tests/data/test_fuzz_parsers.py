"""A bounded fuzzing run of every data parser, part of the normal test run.

Each parser reads damaged copies of a valid layout (test_parsers_property.py's targets
and mutations), and group-name parsing reads random names, checked against the
documented rule (test_groups_property.py). Input ``i`` of a parser is drawn from
``default_rng([FUZZ_SEED, parser, i])``, so a failure names the seed that reproduces it.
Every outcome must be "parsed" or a one-line ValueError / FileNotFoundError naming the
damaged folder. Run with ``-s`` to see the counts.

By default every parser gets the same FUZZ_INPUTS inputs on every machine (about 20 s
in all on 2 cores), so the test run is reproducible; IMPLICITLM_FUZZ_SECONDS=N fuzzes
for N seconds shared by the parsers instead, going on to inputs no run has tried yet.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterator

import numpy as np
import pytest
from tests.data.test_groups_property import names_are_cheap, reference_order
from tests.data.test_parsers_property import TARGETS, Layout, RngChooser

from implicitlm.data.groups import MAX_TABLE_ENTRIES, FiniteAlgebra, get_group

FUZZ_SEED = 20240601
FUZZ_INPUTS = 1000
TOTAL_SECONDS = float(os.environ.get("IMPLICITLM_FUZZ_SECONDS", "0"))
PARSERS = [target.name for target in TARGETS] + ["group-names"]
SECONDS_PER_PARSER = TOTAL_SECONDS / len(PARSERS)


@pytest.fixture(scope="module")
def summary() -> Iterator[dict[str, dict[str, int]]]:
    counts: dict[str, dict[str, int]] = {}
    yield counts
    budget = f"{SECONDS_PER_PARSER:.1f} s" if TOTAL_SECONDS else f"{FUZZ_INPUTS} inputs"
    print(f"\nfuzzing, {budget} per parser:")
    for name, outcome in counts.items():
        print(f"  {name:16s} {sum(outcome.values()):6d} inputs: {outcome}")


def fuzz(name: str, trial: Callable[[np.random.Generator], str]) -> dict[str, int]:
    """Run ``trial`` on seeded generators, FUZZ_INPUTS times or until the parser's time is
    up; counts outcomes."""
    counts: dict[str, int] = {}
    index = PARSERS.index(name)
    deadline = time.monotonic() + SECONDS_PER_PARSER
    number = 0
    while (time.monotonic() < deadline) if TOTAL_SECONDS else number < FUZZ_INPUTS:
        seed = [FUZZ_SEED, index, number]
        try:
            outcome = trial(np.random.default_rng(seed))
        except BaseException as error:
            message = f"{name}: the input from default_rng({seed}) gave {type(error).__name__}: {error}"
            raise AssertionError(message) from error
        counts[outcome] = counts.get(outcome, 0) + 1
        number += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS, ids=lambda target: target.name)
def test_fuzz_file_parser(target: Any, tmp_path, summary, record_property) -> None:
    layout = Layout(target, tmp_path)
    counts = fuzz(target.name, lambda rng: layout.trial(RngChooser(rng)))
    summary[target.name] = counts
    record_property("fuzz_inputs", sum(counts.values()))
    assert sum(counts.values()) >= 10, f"{target.name}: only {counts} in {SECONDS_PER_PARSER:.1f} s"
    assert counts.get("refused", 0) > 0, f"{target.name}: no damaged input was refused: {counts}"


# Pieces of group names: factors, separators, near misses and odd characters.
FACTOR_PIECES = ["S1", "S3", "S5", "S8", "S9", "A2", "A4", "A6", "A8", "Z1", "Z2", "Z7", "Z1000", "Z1001", "M"]
NOISE_PIECES = [
    "S", "A", "Z", "X", "s", "Q", "0", "5", "00", " ", "\n", "\t", "-", "²", "٣", "\x00", "\u2028", "9" * 5000,
]


def group_name_trial(rng: np.random.Generator) -> str:
    """A name of factors and separators, some pieces replaced by noise; the outcome must
    follow the documented rule (test_groups_property.reference_order)."""
    pieces = []
    for number in range(int(rng.integers(1, 5))):
        if number:
            pieces.append("x" if rng.random() < 0.7 else "×")
        pool = NOISE_PIECES if rng.random() < 0.2 else FACTOR_PIECES
        pieces.append(pool[int(rng.integers(0, len(pool)))])
    name = "".join(pieces)
    if not names_are_cheap(name):
        return "not built (large table)"
    order = reference_order(name)
    try:
        algebra = get_group(name)
    except ValueError as error:
        assert "\n" not in str(error) and len(str(error)) < 500, repr(str(error)[:200])
        assert order is None or order * order > MAX_TABLE_ENTRIES, f"{name!r} refused: {error}"
        return "refused"
    assert isinstance(algebra, FiniteAlgebra) and algebra.order == order, name
    return "parsed"


def test_fuzz_group_names(summary, record_property) -> None:
    counts = fuzz("group-names", group_name_trial)
    summary["group-names"] = counts
    record_property("fuzz_inputs", sum(counts.values()))
    assert counts.get("parsed", 0) > 0 and counts.get("refused", 0) > 0, counts
