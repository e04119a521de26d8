"""Multiplication tables of the word-problem groups and the monoid M."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from implicitlm.data.groups import FiniteAlgebra, get_group, smallest_uint_dtype

SMALL_ALGEBRAS = ["S1", "S3", "S4", "A4", "A5", "S5", "Z1", "Z7", "S3xZ2", "A4xZ3", "M", "A5xM", "D3", "D4", "D8",
                  "SL(2,3)", "D8xZ3"]


def lexicographic_permutations(n: int) -> list[tuple[int, ...]]:
    return sorted(itertools.permutations(range(n)))


def is_even(perm: tuple[int, ...]) -> bool:
    inversions = sum(perm[i] > perm[j] for i in range(len(perm)) for j in range(i + 1, len(perm)))
    return inversions % 2 == 0


def compose_one_line(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(a[b[i]] for i in range(len(a)))


def assert_associative(algebra: FiniteAlgebra) -> None:
    table = algebra.table.astype(np.int64)
    elements = np.arange(algebra.order)
    left_first = table[table[:, :, None], elements[None, None, :]]
    right_first = table[elements[:, None, None], table[None, :, :]]
    np.testing.assert_array_equal(left_first, right_first)


@pytest.mark.parametrize(
    ("name", "order"),
    [
        ("S5", 120),
        ("A5", 60),
        ("Z7", 7),
        ("S3", 6),
        ("A4", 12),
        ("S1", 1),
        ("A2", 1),
        ("M", 4),
        ("A5xM", 240),
        ("A5×M", 240),
        ("S3xZ2", 12),
        ("A5xZ2xZ3", 360),
        ("Z1000", 1000),
        ("D3", 6),
        ("D8", 16),
        ("SL(2,3)", 24),
        ("D8xZ3", 48),
        ("SL(2,3)xZ2", 48),
    ],
)
def test_orders(name: str, order: int) -> None:
    algebra = get_group(name)
    assert algebra.order == order
    assert algebra.table.shape == (order, order)
    assert algebra.table.dtype == smallest_uint_dtype(order)


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL_ALGEBRAS)
def test_table_is_closed_associative_with_identity_zero(name: str) -> None:
    algebra = get_group(name)
    elements = np.arange(algebra.order)
    assert algebra.identity == 0
    assert int(algebra.table.max()) < algebra.order
    np.testing.assert_array_equal(algebra.table[0], elements)
    np.testing.assert_array_equal(algebra.table[:, 0], elements)
    assert_associative(algebra)


@pytest.mark.parametrize("name", [name for name in SMALL_ALGEBRAS if "M" not in name])
def test_groups_have_inverses(name: str) -> None:
    algebra = get_group(name)
    elements = np.arange(algebra.order)
    inverses = algebra.inverse(elements)
    assert algebra.is_group
    assert (algebra.compose(elements, inverses) == 0).all()
    assert (algebra.compose(inverses, elements) == 0).all()
    assert algebra.inverse(0) == 0


def test_worked_example_of_the_composition_convention() -> None:
    # 1-based: s1=(5,4,1,3,2), s2=(3,4,1,2,5) give (1,3,5,4,2);
    # then s3=(5,3,1,2,4) gives (2,5,1,3,4).
    index = {perm: i for i, perm in enumerate(lexicographic_permutations(5))}

    def element(one_based: tuple[int, ...]) -> int:
        return index[tuple(k - 1 for k in one_based)]

    s5 = get_group("S5")
    after_two = s5.compose(element((5, 4, 1, 3, 2)), element((3, 4, 1, 2, 5)))
    assert after_two == element((1, 3, 5, 4, 2))
    assert s5.compose(after_two, element((5, 3, 1, 2, 4))) == element((2, 5, 1, 3, 4))


@pytest.mark.parametrize("n", [3, 4])
def test_symmetric_table_matches_one_line_composition(n: int) -> None:
    perms = lexicographic_permutations(n)
    index = {perm: i for i, perm in enumerate(perms)}
    table = get_group(f"S{n}").table
    for a, b in itertools.product(range(len(perms)), repeat=2):
        assert table[a, b] == index[compose_one_line(perms[a], perms[b])]


def test_a5_is_the_even_part_of_s5() -> None:
    s5_perms = lexicographic_permutations(5)
    s5_index = {perm: i for i, perm in enumerate(s5_perms)}
    even = [perm for perm in s5_perms if is_even(perm)]
    embedding = np.array([s5_index[perm] for perm in even])
    a5, s5 = get_group("A5"), get_group("S5")
    assert len(even) == a5.order == 60
    np.testing.assert_array_equal(
        s5.table[embedding[:, None], embedding[None, :]], embedding[a5.table.astype(np.int64)]
    )


def test_cyclic_elements_are_rotations() -> None:
    n = 7
    rotations = [tuple((i + k) % n for i in range(n)) for k in range(n)]
    index = {rotation: k for k, rotation in enumerate(rotations)}
    table = get_group(f"Z{n}").table
    for a, b in itertools.product(range(n), repeat=2):
        assert table[a, b] == index[compose_one_line(rotations[a], rotations[b])]


def element_orders(name: str) -> list[int]:
    """The order of each element: the least k with g^k the identity."""
    algebra = get_group(name)
    orders = []
    for g in range(algebra.order):
        power, k = g, 1
        while power != algebra.identity:
            power, k = int(algebra.compose(power, g)), k + 1
        orders.append(k)
    return orders


def centre(name: str) -> list[int]:
    table = get_group(name).table
    return [g for g in range(len(table)) if np.array_equal(table[g, :], table[:, g])]


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_a_dihedral_group_is_n_rotations_and_n_reflections_of_the_n_gon(n: int) -> None:
    orders = element_orders(f"D{n}")
    # The rotations by k have order n / gcd(n, k); every reflection is an involution.
    rotations = sorted(n // np.gcd(n, k) for k in range(n))
    assert len(orders) == 2 * n and orders.count(2) == n + (n % 2 == 0)
    assert sorted(orders) == sorted(rotations + [2] * n)
    # D3 is S3; for n >= 3 the group is not abelian, and its centre is {1} or {1, the half turn}.
    assert len(centre(f"D{n}")) == (1 if n % 2 else 2)
    if n == 3:
        np.testing.assert_array_equal(get_group("D3").table, get_group("S3").table)


def test_sl_2_3_has_one_involution_and_a_centre_of_two():
    """SL(2,3), order 24, is not S4 (9 involutions): -I is its only element of order 2 and,
    with I, its centre; its elements have orders 1, 2, 3, 4 and 6 (1 + 1 + 8 + 6 + 8)."""
    orders = element_orders("SL(2,3)")
    assert {k: orders.count(k) for k in set(orders)} == {1: 1, 2: 1, 3: 8, 4: 6, 6: 8}
    assert len(centre("SL(2,3)")) == 2
    assert sorted(element_orders("S4")).count(2) == 9


def test_s3_is_not_abelian_and_cyclic_groups_are() -> None:
    s3 = get_group("S3").table
    assert not np.array_equal(s3, s3.T)
    for name in ["Z2", "Z7", "Z12"]:
        table = get_group(name).table
        np.testing.assert_array_equal(table, table.T)


def test_direct_product_numbers_pairs_lexicographically_and_composes_componentwise() -> None:
    s3, z4, product = get_group("S3"), get_group("Z4"), get_group("S3xZ4")
    assert product.name == "S3xZ4"
    assert product.factor_orders == (6, 4)
    for (i, j), (k, l) in itertools.product(itertools.product(range(6), range(4)), repeat=2):
        assert product.table[i * 4 + j, k * 4 + l] == s3.table[i, k] * 4 + z4.table[j, l]


def test_three_factor_product_numbers_triples_lexicographically() -> None:
    a5, z2, z3 = get_group("A5"), get_group("Z2"), get_group("Z3")
    product = get_group("A5xZ2xZ3")
    rng = np.random.default_rng(0)
    x, y, z = rng.integers(0, 360, size=(3, 10_000))
    np.testing.assert_array_equal(
        product.compose(product.compose(x, y), z), product.compose(x, product.compose(y, z))
    )
    expected = (
        a5.table[x // 6, y // 6].astype(np.int64) * 6
        + z2.table[(x // 3) % 2, (y // 3) % 2] * 3
        + z3.table[x % 3, y % 3]
    )
    np.testing.assert_array_equal(product.compose(x, y), expected)


def test_monoid_m_is_the_aperiodic_monoid_of_the_reference() -> None:
    m = get_group("M")
    e, a, b, x = range(4)
    assert not m.is_group
    assert [m.compose(a, a), m.compose(a, b), m.compose(b, a), m.compose(b, b)] == [x, x, a, b]
    assert (m.table[x] == x).all() and (m.table[:, x] == x).all()
    for element in range(4):
        square = m.compose(element, element)
        assert m.compose(square, element) == square  # x^2 = x^3: aperiodic
    with pytest.raises(ValueError, match="monoid"):
        m.inverse(1)


def test_a5_times_m_is_a_240_element_monoid() -> None:
    product = get_group("A5xM")
    assert product.order == 240 and not product.is_group
    assert product.factor_orders == (60, 4)
    assert get_group("A5×M") is product


@pytest.mark.parametrize(
    "name", ["S0", "Q8", "foo", "", "Z0", "S9", "Z1001", "A5x", "xM", "S05", "s5", "S5 ", "D2", "D9", "SL(2,5)", "SL2"]
)
def test_unknown_names_raise_a_clear_error(name: str) -> None:
    with pytest.raises(ValueError, match="unknown group name") as error:
        get_group(name)
    assert repr(name) in str(error.value)
    assert "Z<n>" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["S8", "A8", "S7xZ4"])
def test_tables_too_large_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="limit"):
        get_group(name)


def test_tables_are_cached_and_read_only() -> None:
    s4 = get_group("S4")
    assert get_group("S4") is s4
    with pytest.raises(ValueError):
        s4.table[0, 0] = 1


@pytest.mark.parametrize(
    ("count", "dtype"),
    [(1, np.uint8), (256, np.uint8), (257, np.uint16), (65536, np.uint16), (65537, np.uint32)],
)
def test_smallest_uint_dtype(count: int, dtype: type) -> None:
    assert smallest_uint_dtype(count) == np.dtype(dtype)
