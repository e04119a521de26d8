"""Word-problem generation, storage formats and the torch Dataset."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from implicitlm.core import atomic_io
from implicitlm.data import words
from implicitlm.core.errors import DataError
from implicitlm.data.groups import get_group
from implicitlm.data.word_dataset import WordDataset
from implicitlm.data.word_storage import load_words, save_words, sidecar_path, write_generated_words
from implicitlm.data.words import generate_words, hard_token_mask, prefix_products, verify_targets

# The reference's Cayley table of M over its elements E, A, B, X (rows: left operand).
MONOID_M = {
    "E": dict(E="E", A="A", B="B", X="X"),
    "A": dict(E="A", A="X", B="X", X="X"),
    "B": dict(E="B", A="A", B="B", X="X"),
    "X": dict(E="X", A="X", B="X", X="X"),
}

Element = Any
Reference = tuple[list[Element], Callable[[Element, Element], Element]]


def reference_factor(factor: str) -> Reference:
    """Elements in index order and their product, from first principles (no tables)."""
    if factor == "M":
        return list("EABX"), lambda a, b: MONOID_M[a][b]
    kind, n = factor[0], int(factor[1:])
    if kind == "Z":
        elements = [tuple((i + k) % n for i in range(n)) for k in range(n)]
    else:
        elements = sorted(itertools.permutations(range(n)))
        if kind == "A":
            elements = [
                p
                for p in elements
                if sum(p[i] > p[j] for i, j in itertools.combinations(range(n), 2)) % 2 == 0
            ]
    return elements, lambda a, b: tuple(a[b[i]] for i in range(n))


def reference_algebra(name: str) -> Reference:
    factors = [reference_factor(factor) for factor in name.replace("×", "x").split("x")]
    elements = list(itertools.product(*(elements for elements, _ in factors)))
    composes = [compose for _, compose in factors]
    return elements, lambda a, b: tuple(f(x, y) for f, x, y in zip(composes, a, b))


def reference_prefix_products(name: str, inputs: np.ndarray) -> np.ndarray:
    elements, compose = reference_algebra(name)
    index = {element: i for i, element in enumerate(elements)}
    targets = []
    for word in inputs.tolist():
        running = elements[word[0]]
        row = [index[running]]
        for token in word[1:]:
            running = compose(running, elements[token])
            row.append(index[running])
        targets.append(row)
    return np.array(targets)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("A5", np.uint8), ("A5xM", np.uint8), ("A5xZ2xZ3", np.uint16), ("Z1000", np.uint16)],
)
def test_shapes_and_smallest_dtype(name: str, dtype: type) -> None:
    inputs, targets = generate_words(name, length=9, count=5, seed=3)
    assert inputs.shape == targets.shape == (5, 9)
    assert inputs.dtype == targets.dtype == np.dtype(dtype)
    assert int(inputs.max()) < get_group(name).order


def test_labels_are_aligned_prefix_products() -> None:
    inputs, targets = generate_words("S3", length=6, count=4, seed=1)
    np.testing.assert_array_equal(targets[:, 0], inputs[:, 0])
    s3 = get_group("S3")
    np.testing.assert_array_equal(targets[:, 3], s3.compose(targets[:, 2], inputs[:, 3]))


def test_worked_example_as_a_word() -> None:
    perms = sorted(itertools.permutations(range(5)))
    index = {perm: i for i, perm in enumerate(perms)}
    word = [
        index[tuple(k - 1 for k in p)] for p in [(5, 4, 1, 3, 2), (3, 4, 1, 2, 5), (5, 3, 1, 2, 4)]
    ]
    labels = prefix_products("S5", np.array([word], dtype=np.uint8))[0]
    assert [perms[i] for i in labels[1:]] == [(0, 2, 4, 3, 1), (1, 4, 0, 2, 3)]


def test_same_seed_same_data_different_seed_different_data() -> None:
    first = generate_words("A5xM", length=16, count=8, seed=7, hard_prob=0.5)
    again = generate_words("A5xM", length=16, count=8, seed=7, hard_prob=0.5)
    other = generate_words("A5xM", length=16, count=8, seed=8, hard_prob=0.5)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other[0])


@pytest.mark.parametrize("name", ["S3", "S4", "A5", "Z7", "S3xZ2", "M", "A5xM", "A4xZ2xZ3"])
def test_targets_match_independent_recomputation(name: str) -> None:
    inputs, targets = generate_words(name, length=12, count=6, seed=5)
    np.testing.assert_array_equal(targets, reference_prefix_products(name, inputs))
    assert verify_targets(name, inputs, targets)


def test_generation_spans_several_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(words, "BLOCK_TOKENS", 40)
    inputs, targets = generate_words("A5", length=10, count=13, seed=2)
    np.testing.assert_array_equal(targets, reference_prefix_products("A5", inputs))
    assert verify_targets("A5", inputs, targets)


def test_verify_targets_detects_a_wrong_label() -> None:
    inputs, targets = generate_words("A5", length=8, count=3, seed=0)
    wrong = targets.copy()
    wrong[1, 5] = (wrong[1, 5] + 1) % 60
    assert not verify_targets("A5", inputs, wrong)
    assert not verify_targets("A5", inputs, targets[:, :-1])


def test_hard_token_frequency_follows_the_reference_rule() -> None:
    inputs, _ = generate_words("A5xM", length=256, count=4000, seed=0, hard_prob=0.9)
    hard = hard_token_mask("A5xM", inputs)
    # With probability 0.1 the A5 part is uniform over all 60 elements, identity included.
    assert abs(hard.mean() - 0.1 * 59 / 60) < 0.001
    monoid_counts = np.bincount((inputs % 4).ravel(), minlength=4) / inputs.size
    np.testing.assert_allclose(monoid_counts, 0.25, atol=0.005)


def test_hard_prob_one_leaves_only_the_monoid() -> None:
    inputs, targets = generate_words("A5xM", length=32, count=16, seed=0, hard_prob=1.0)
    assert not hard_token_mask("A5xM", inputs).any()
    assert (targets < 4).all()


@pytest.mark.parametrize(
    ("name", "hard_prob", "match"),
    [("A5", 0.9, "direct product"), ("M", 0.9, "direct product"), ("A5xM", 1.5, r"\[0, 1\]")],
)
def test_bad_hard_prob_is_refused(name: str, hard_prob: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate_words(name, length=4, count=2, hard_prob=hard_prob)


@pytest.mark.parametrize(
    ("length", "count", "seed"), [(0, 1, 0), (3, 0, 0), (3, 1, -1), (2.5, 1, 0)]
)
def test_bad_sizes_are_refused(length: Any, count: int, seed: int) -> None:
    with pytest.raises(ValueError):
        generate_words("S3", length=length, count=count, seed=seed)


GROUPS_FOR_PROPERTIES = ["S3", "A4", "S4", "Z5", "S3xZ2", "M", "A5xM"]


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(GROUPS_FOR_PROPERTIES),
    length=st.integers(1, 24),
    count=st.integers(1, 6),
    seed=st.integers(0, 2**32),
    hard_prob=st.one_of(st.none(), st.floats(0.0, 1.0)),
)
def test_property_targets_equal_recomputation(
    name: str, length: int, count: int, seed: int, hard_prob: float | None
) -> None:
    if hard_prob is not None and "x" not in name:
        hard_prob = None
    inputs, targets = generate_words(
        name, length=length, count=count, seed=seed, hard_prob=hard_prob
    )
    np.testing.assert_array_equal(targets, reference_prefix_products(name, inputs))


@pytest.mark.parametrize("filename", ["words.npy", "words.bin"])
def test_memory_mapped_round_trip(tmp_path: Path, filename: str) -> None:
    inputs, targets = generate_words("A5xM", length=20, count=7, seed=4, hard_prob=0.9)
    path = tmp_path / filename
    save_words(path, inputs, targets, {"group": "A5×M", "seed": 4, "hard_prob": 0.9})
    loaded = load_words(path)
    assert isinstance(loaded.inputs, np.memmap) and not loaded.inputs.flags.writeable
    np.testing.assert_array_equal(loaded.inputs, inputs)
    np.testing.assert_array_equal(loaded.targets, targets)
    assert loaded.group == "A5xM"
    assert loaded.meta == {
        "group": "A5xM",
        "length": 20,
        "count": 7,
        "seed": 4,
        "hard_prob": 0.9,
        "format_version": 1,
    }
    assert np.load(path, mmap_mode="r").shape == (2, 7, 20)
    assert sorted(os.listdir(tmp_path)) == sorted([filename, filename + ".json"])


def test_generating_to_file_gives_the_in_memory_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(words, "BLOCK_TOKENS", 64)
    loaded = write_generated_words(
        tmp_path / "train.npy", "A5xM", length=16, count=9, seed=3, hard_prob=0.9
    )
    inputs, targets = generate_words("A5xM", length=16, count=9, seed=3, hard_prob=0.9)
    np.testing.assert_array_equal(loaded.inputs, inputs)
    np.testing.assert_array_equal(loaded.targets, targets)
    assert loaded.meta["seed"] == 3 and loaded.meta["hard_prob"] == 0.9


def test_loading_with_the_wrong_group_or_no_metadata_fails(tmp_path: Path) -> None:
    inputs, targets = generate_words("A5", length=4, count=2)
    path = tmp_path / "a5.npy"
    save_words(path, inputs, targets, {"group": "A5", "seed": 0})
    with pytest.raises(DataError, match="not S5"):
        load_words(path, group="S5")
    sidecar_path(path).unlink()
    with pytest.raises(DataError, match="metadata file"):
        load_words(path)


def test_saving_out_of_range_words_is_refused(tmp_path: Path) -> None:
    inputs, targets = generate_words("S5", length=4, count=2)
    with pytest.raises(ValueError, match=r"\[0, 60\)"):
        save_words(tmp_path / "w.npy", inputs + 60, targets, {"group": "A5", "seed": 0})
    assert os.listdir(tmp_path) == []


def test_csv_round_trip(tmp_path: Path) -> None:
    inputs, targets = generate_words("S5", length=12, count=5, seed=11)
    path = tmp_path / "S5=12.csv"
    save_words(path, inputs, targets, {"group": "S5", "seed": 11})
    lines = path.read_text().splitlines()
    assert lines[0] == "seed,input,target"
    assert lines[1] == f"11,{' '.join(map(str, inputs[0]))},{' '.join(map(str, targets[0]))}"
    loaded = load_words(path, group="S5")
    np.testing.assert_array_equal(loaded.inputs, inputs)
    np.testing.assert_array_equal(loaded.targets, targets)
    assert loaded.inputs.dtype == np.uint8
    assert loaded.meta["seed"] == 11 and loaded.group == "S5"


def test_csv_accepts_quoted_fields(tmp_path: Path) -> None:
    path = tmp_path / "S3=4.csv"
    path.write_text('seed,input,target\n123,"5 4 2 4","5 1 4 3"\n123,5 0 2 2,5 5 3 5\n')
    loaded = load_words(path, group="S3")
    np.testing.assert_array_equal(loaded.inputs, [[5, 4, 2, 4], [5, 0, 2, 2]])
    np.testing.assert_array_equal(loaded.targets, [[5, 1, 4, 3], [5, 5, 3, 5]])


def test_csv_needs_a_group(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("seed,input,target\n0,1,1\n")
    with pytest.raises(ValueError, match="group"):
        load_words(path)


@pytest.mark.parametrize(
    ("content", "line", "expected"),
    [
        ("", 1, "expected header"),
        ("length,input,target\n4,1 2,1 3\n", 1, "expected header"),
        ("seed,input,target\n", 2, "at least one row"),
        ("seed,input,target\n0,1 2,1 3\n0,1 x,1 3\n", 3, "non-negative integers in input"),
        ("seed,input,target\n0,1 2,1 2.5\n", 2, "non-negative integers in target"),
        ("seed,input,target\n0,-1 2,1 3\n", 2, "non-negative integers"),
        ("seed,input,target\n0,1 60,1 3\n", 2, "below 60"),
        ("seed,input,target\n0,1 2 3,1 2\n", 2, "equal length"),
        ("seed,input,target\n0,1 2,1 3\n0,1 2 3,1 2 3\n", 3, "elements per word"),
        ("seed,input,target\n0,1 2\n", 2, "3 columns"),
        ("seed,input,target\n0,,\n", 2, "at least one element"),
        ("seed,input,target\nzero,1 2,1 3\n", 2, "integer seed"),
    ],
)
def test_malformed_csv_names_file_and_line(
    tmp_path: Path, content: str, line: int, expected: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(DataError) as error:
        load_words(path, group="A5")
    message = str(error.value)
    assert isinstance(error.value, ValueError)
    assert f"{path}:{line}:" in message and expected in message and "\n" not in message


@pytest.mark.parametrize("filename", ["words.npy", "words.csv"])
def test_failed_write_leaves_no_file_and_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filename: str
) -> None:
    inputs, targets = generate_words("A5", length=6, count=3, seed=0)
    path = tmp_path / filename

    def fail(_: Path) -> None:
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(atomic_io, "_fsync", fail)
        with pytest.raises(OSError, match="disk full"):
            save_words(path, inputs, targets, {"group": "A5", "seed": 0})
    assert os.listdir(tmp_path) == []

    save_words(path, inputs, targets, {"group": "A5", "seed": 0})
    before = sorted(os.listdir(tmp_path))
    other_inputs, other_targets = generate_words("A5", length=6, count=3, seed=1)
    with monkeypatch.context() as patch:
        patch.setattr(atomic_io, "_fsync", fail)
        with pytest.raises(OSError):
            save_words(path, other_inputs, other_targets, {"group": "A5", "seed": 1})
    assert sorted(os.listdir(tmp_path)) == before
    np.testing.assert_array_equal(load_words(path, group="A5").inputs, inputs)


def test_dataset_yields_int64_aligned_items(tmp_path: Path) -> None:
    inputs, targets = generate_words("A5xM", length=10, count=4, seed=0, hard_prob=0.9)
    path = tmp_path / "w.npy"
    save_words(path, inputs, targets, {"group": "A5xM", "seed": 0, "hard_prob": 0.9})
    dataset = WordDataset(load_words(path))
    assert len(dataset) == 4 and dataset.vocab_size == 240
    item = dataset[2]
    assert set(item) == {"input_ids", "labels"}
    assert item["input_ids"].dtype == item["labels"].dtype == torch.int64
    assert item["input_ids"].shape == (10,)
    np.testing.assert_array_equal(item["input_ids"].numpy(), inputs[2])
    np.testing.assert_array_equal(item["labels"].numpy(), targets[2])


# ---------------------------------------------------------------- evaluation in windows


def test_test_words_drawn_in_windows_are_the_words_drawn_whole():
    from implicitlm.data.words import TILE_POSITIONS, GeneratedWords

    whole = generate_words("A5xM", length=40, count=6, seed=9, hard_prob=0.5)
    np.testing.assert_array_equal(GeneratedWords("A5xM", 40, 6, seed=9, hard_prob=0.5).arrays()[0], whole[0])
    long = GeneratedWords("S5", TILE_POSITIONS + 300, 3, seed=2)
    inputs, targets = long.arrays()
    np.testing.assert_array_equal(targets, prefix_products("S5", inputs))
    bounds = [0, 1000, TILE_POSITIONS - 1, TILE_POSITIONS + 5, TILE_POSITIONS + 300]
    windows = [long.window(start, end) for start, end in zip(bounds, bounds[1:])]
    np.testing.assert_array_equal(np.concatenate([w[0] for w in windows], axis=1), inputs)
    np.testing.assert_array_equal(np.concatenate([w[1] for w in windows], axis=1), targets)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_an_evaluation_in_windows_scores_exactly_as_one_forward_over_the_whole_words(trained_s3, monkeypatch, mode):
    """Chunked solves carry the state from window to window: accuracy, iterations and every
    convergence count are those of one forward per batch over the whole words."""
    from implicitlm.tasks import word_scoring
    from implicitlm.tasks.words import held_out_word_windows

    model, _ = trained_s3
    words = held_out_word_windows("S3", 101, 6, seed=3)
    whole = word_scoring.word_accuracy(model, words, mode=mode, batch_size=4, max_iter=24, warn=False)
    monkeypatch.setattr(word_scoring, "WINDOW_TOKENS", 4 * 24)  # windows of 2 chunks of 12 (sequential: 24 tokens)
    assert word_scoring.evaluation_window(model, (mode,), 101, 4) == 24
    windowed = word_scoring.word_accuracy(model, words, mode=mode, batch_size=4, max_iter=24, warn=False)
    assert windowed == whole
    assert whole["fp_fixed_points"] == (6 if mode == "simultaneous" else 6 * 101)


@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_prefixes_read_once_score_as_each_prefix_evaluated_alone(trained_s3, monkeypatch, mode):
    """One read of 101-token words gives, at 29 and 65 tokens (chunk boundaries of 12 counted
    from the end), the rows of the 29- and 65-token prefixes evaluated as words of their own,
    passes and convergence counts too; windows smaller than a prefix split where it ends."""
    from implicitlm.tasks import word_scoring
    from implicitlm.tasks.words import held_out_words

    model, _ = trained_s3
    inputs, targets = held_out_words("S3", 101, 6, seed=3)
    monkeypatch.setattr(word_scoring, "WINDOW_TOKENS", 4 * 24)
    rows = word_scoring.prefix_accuracy(model, inputs, targets, (65, 29), mode, max_iter=24, batch_size=4, warn=False)
    alone = [word_scoring.word_accuracy(model, inputs[:, :n], targets[:, :n], mode, max_iter=24, batch_size=4, warn=False)
             for n in (29, 65, 101)]
    assert rows == alone
    assert [row["fp_fixed_points"] for row in rows] == ([6, 6, 6] if mode == "simultaneous" else [6 * 29, 6 * 65, 6 * 101])


@pytest.mark.parametrize("prefixes, fixed_point, refusal", [
    ((30,), None, "do not end on a chunk boundary"),
    ((101,), None, "shorter than the words"),
    ((1,), None, "at least 2"),
    ((29,), {"chunk_length": 0}, "need a chunked simultaneous solve"),
])
def test_a_prefix_its_own_evaluation_would_score_otherwise_is_refused(trained_s3, prefixes, fixed_point, refusal):
    from implicitlm.core.errors import OptionError
    from implicitlm.tasks.word_scoring import prefix_cuts

    model, _ = trained_s3
    with pytest.raises(OptionError, match=refusal):
        prefix_cuts(model, "simultaneous", 101, prefixes, fixed_point)
    assert prefix_cuts(model, "sequential", 101, (30, 2)) == (2, 30)  # one token a solve: any prefix
