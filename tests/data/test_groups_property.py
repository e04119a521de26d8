"""Properties of random groups and monoids and of the words drawn over them.

test_groups.py checks fixed groups and test_words.py fixed words; here hypothesis draws
the algebra (products of up to three factors among S_n, A_n, Z_n and M, joined by "x" or
"×"), and the checks compare against first principles: permutations and rotations
composed directly, and the monoid M's table from the reference (test_words.py).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.data.test_words import reference_algebra, reference_prefix_products

from implicitlm.data.groups import MAX_TABLE_ENTRIES, FiniteAlgebra, get_group
from implicitlm.data.words import DerivedTargets, generate_words, hard_token_mask

PROPERTY = settings(max_examples=60, deadline=None)
# Factors drawn for the table checks: small enough that a product of three stays cheap.
SMALL_FACTORS = ["S1", "S2", "S3", "S4", "A1", "A2", "A3", "A4", "A5", "Z1", "Z2", "Z3", "Z5", "Z8", "M"]
MAX_ORDER = 720  # products larger than this are drawn again


def factor_order(factor: str) -> int:
    """The order of a factor from its definition."""
    if factor == "M":
        return 4
    kind, n = factor[0], int(factor[1:])
    if kind == "S":
        return math.factorial(n)
    return max(1, math.factorial(n) // 2) if kind == "A" else n


@st.composite
def algebra_names(draw: st.DrawFn) -> str:
    factors = draw(
        st.lists(st.sampled_from(SMALL_FACTORS), min_size=1, max_size=3).filter(
            lambda factors: math.prod(map(factor_order, factors)) <= MAX_ORDER
        )
    )
    separators = [draw(st.sampled_from(["x", "×"])) for _ in factors[1:]]
    return factors[0] + "".join(sep + factor for sep, factor in zip(separators, factors[1:]))


def factors_of(name: str) -> list[str]:
    return re.split("[x×]", name)


@PROPERTY
@given(name=algebra_names(), seed=st.integers(0, 2**32))
def test_table_is_closed_with_identity_and_associative_on_random_triples(name: str, seed: int) -> None:
    algebra = get_group(name)
    order = math.prod(map(factor_order, factors_of(name)))
    table = algebra.table.astype(np.int64)
    assert algebra.order == order and table.shape == (order, order)
    assert table.min() >= 0 and table.max() < order  # closure
    np.testing.assert_array_equal(table[0], np.arange(order))  # identity on the left ...
    np.testing.assert_array_equal(table[:, 0], np.arange(order))  # ... and on the right
    a, b, c = np.random.default_rng(seed).integers(0, order, size=(3, 2000))
    np.testing.assert_array_equal(table[table[a, b], c], table[a, table[b, c]])


@PROPERTY
@given(name=algebra_names())
def test_groups_have_two_sided_inverses_and_monoids_refuse_them(name: str) -> None:
    algebra = get_group(name)
    elements = np.arange(algebra.order)
    has_monoid = "M" in factors_of(name)
    assert algebra.is_group == (not has_monoid)
    if has_monoid:
        # The monoid part has elements (A, B, X) that no element undoes.
        assert not (algebra.table == 0).any(axis=1).all()
        with pytest.raises(ValueError, match="monoid"):
            algebra.inverse(elements)
        return
    inverses = algebra.inverse(elements).astype(np.int64)
    assert (algebra.compose(elements, inverses) == 0).all()
    assert (algebra.compose(inverses, elements) == 0).all()
    np.testing.assert_array_equal(algebra.inverse(inverses), elements)
    # In a group every row and every column is a permutation of the elements (Latin square).
    assert all(len(np.unique(row)) == algebra.order for row in algebra.table)
    assert all(len(np.unique(column)) == algebra.order for column in algebra.table.T)


@PROPERTY
@given(count=st.integers(1, 3))
def test_products_of_m_alone_are_aperiodic(count: int) -> None:
    """M, and so each power of it, satisfies x·x = x·x·x: it recognises only star-free languages."""
    algebra = get_group("x".join(["M"] * count))
    elements = np.arange(algebra.order)
    square = algebra.compose(elements, elements)
    np.testing.assert_array_equal(algebra.compose(square, elements), square)
    absorbing = algebra.order - 1  # X in every component
    assert (algebra.table[absorbing] == absorbing).all() and (algebra.table[:, absorbing] == absorbing).all()


@PROPERTY
@given(name=algebra_names(), seed=st.integers(0, 2**32))
def test_table_agrees_with_composing_the_elements(name: str, seed: int) -> None:
    """Element i is the i-th tuple of factor elements (permutations in lexicographic order,
    rotations, M's letters); the table is their componentwise composition."""
    algebra = get_group(name)
    elements, compose = reference_algebra(name)
    index = {element: i for i, element in enumerate(elements)}
    assert len(index) == algebra.order
    a, b = np.random.default_rng(seed).integers(0, algebra.order, size=(2, 300))
    expected = [index[compose(elements[i], elements[j])] for i, j in zip(a.tolist(), b.tolist())]
    np.testing.assert_array_equal(algebra.compose(a, b), expected)
    assert algebra.factor_orders == tuple(map(factor_order, factors_of(name)))
    assert get_group(algebra.name) is algebra and "×" not in algebra.name


@PROPERTY
@given(
    name=algebra_names(),
    length=st.integers(1, 20),
    count=st.integers(1, 5),
    seed=st.integers(0, 2**32),
    hard_prob=st.one_of(st.none(), st.floats(0.0, 1.0)),
)
def test_word_targets_are_the_naive_running_products(
    name: str, length: int, count: int, seed: int, hard_prob: float | None
) -> None:
    if len(factors_of(name)) == 1:
        hard_prob = None
    inputs, targets = generate_words(name, length, count, seed, hard_prob)
    assert inputs.dtype == targets.dtype and int(inputs.max()) < get_group(name).order
    np.testing.assert_array_equal(targets, reference_prefix_products(name, inputs))
    derived = DerivedTargets(name, inputs)
    row = int(np.random.default_rng(seed).integers(0, count))
    np.testing.assert_array_equal(derived[row], targets[row])
    np.testing.assert_array_equal(derived[row:, : length // 2], targets[row:, : length // 2])


def first_component_is_identity(name: str, inputs: np.ndarray) -> np.ndarray:
    """From the element tuples: whether each token's first-factor part is the identity."""
    elements, _ = reference_algebra(name)
    first_identity = elements[0][0]
    return np.array([[elements[token][0] == first_identity for token in row] for row in inputs.tolist()])


@settings(max_examples=25, deadline=None)
@given(
    name=algebra_names().filter(lambda name: len(factors_of(name)) > 1 and factor_order(factors_of(name)[0]) > 1),
    hard_prob=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
)
def test_hard_prob_sets_how_often_the_first_factor_is_not_the_identity(name: str, hard_prob: float, seed: int) -> None:
    """As documented: with probability hard_prob the first factor's part is the identity,
    otherwise uniform over that factor; the other factors are uniform. So a token is hard
    with probability (1 - hard_prob) (1 - 1/|G|)."""
    algebra = get_group(name)
    first = algebra.factor_orders[0]
    rest = algebra.order // first
    inputs, _ = generate_words(name, length=100, count=60, seed=seed, hard_prob=hard_prob)
    hard = hard_token_mask(name, inputs)
    np.testing.assert_array_equal(hard[:3], ~first_component_is_identity(name, inputs[:3]))
    tokens = inputs.size
    p = (1 - hard_prob) * (1 - 1 / first)
    assert abs(hard.mean() - p) <= 5 * math.sqrt(p * (1 - p) / tokens) + 3 / tokens
    # The rest is uniform whatever the first part, and the hard first parts are uniform.
    rest_counts = np.bincount((inputs % rest).ravel(), minlength=rest)
    assert np.all(np.abs(rest_counts - tokens / rest) <= 5 * math.sqrt(tokens / rest) + 1)
    if hard.any():
        first_parts = (inputs[hard] // rest).astype(np.int64)
        assert first_parts.min() >= 1
        counts = np.bincount(first_parts, minlength=first)[1:]
        expected = hard.sum() / (first - 1)
        assert np.all(np.abs(counts - expected) <= 5 * math.sqrt(expected) + 1)
    if hard_prob == 1.0:
        assert not hard.any()


@PROPERTY
@given(name=algebra_names().filter(lambda name: len(factors_of(name)) == 1))
def test_hard_prob_needs_a_direct_product(name: str) -> None:
    with pytest.raises(ValueError, match="direct product"):
        generate_words(name, length=3, count=2, hard_prob=0.5)


# ---------------------------------------------------------------- names

FACTOR_FORM = re.compile(r"S[1-8]|A[1-8]|Z([1-9][0-9]{0,2}|1000)|M")
NAME_PIECES = ["S", "A", "Z", "M", "x", "×", "X", "s", "Q", " ", "\n", "-", "0", "1", "2", "3", "6", "8", "9", "1000"]


def reference_order(name: str) -> int | None:
    """The documented rule: the order of the algebra ``name`` names, or None if it names none."""
    factors = re.split("[x×]", name)
    if len(factors) > 16 or not all(FACTOR_FORM.fullmatch(factor) for factor in factors):
        return None
    return math.prod(map(factor_order, factors))


def names_are_cheap(name: str) -> bool:
    """Valid names whose tables are large but allowed would take long to build: not drawn."""
    order = reference_order(name)
    return order is None or order <= 3000 or order * order > MAX_TABLE_ENTRIES


NAMES = st.one_of(
    st.text(max_size=12),
    st.lists(st.sampled_from(NAME_PIECES), max_size=10).map("".join),
    algebra_names(),
).filter(names_are_cheap)


@settings(max_examples=200, deadline=None)
@given(name=NAMES)
def test_get_group_accepts_exactly_the_documented_names(name: str) -> None:
    order = reference_order(name)
    try:
        algebra = get_group(name)
    except ValueError as error:
        message = str(error)
        assert "\n" not in message and len(message) < 400
        assert order is None or order * order > MAX_TABLE_ENTRIES, f"{name!r} refused: {message}"
        return
    assert isinstance(algebra, FiniteAlgebra) and algebra.order == order
    assert algebra.name == name.replace("×", "x")


@pytest.mark.parametrize(
    "name",
    ["S" + "9" * 5000, "x".join(["Z1"] * 17), "Z1x" * 2000 + "Z1", "S3\nx", 42, None, b"S3", "A5xM" * 100],
)
def test_extreme_names_give_one_short_line(name: object) -> None:
    with pytest.raises(ValueError) as error:
        get_group(name)  # type: ignore[arg-type]
    assert "\n" not in str(error.value) and len(str(error.value)) < 400


def test_sixteen_trivial_factors_are_still_a_group() -> None:
    algebra = get_group("x".join(["Z1"] * 15 + ["S3"]))
    assert algebra.order == 6 and algebra.factor_orders == (1,) * 15 + (6,)
