"""Finite groups and monoids as multiplication tables, for word problems.

Element indices of a permutation group are its permutations in lexicographic order of
their 0-based one-line arrays, so the identity is index 0. Composition applies the
right operand first: ``table[a, b]`` is the index of ``perm_a[perm_b]``, which makes the
running product of a word ``label_t = label_{t-1}[g_t]``. A direct product ``G x H``
numbers the pair ``(i, j)`` as ``i * |H| + j`` (lexicographic order of pairs).

Accepted names: ``S<n>``, ``A<n>`` (1 <= n <= 8), ``D<n>`` (the symmetries of the regular
n-gon, order 2n, 3 <= n <= 8, as permutations of its vertices), ``SL(2,3)`` (the 2 x 2
matrices of determinant 1 over the field of 3 elements, order 24, as permutations of the 8
non-zero vectors they act on, in lexicographic order), ``Z<n>`` (1 <= n <= 1000), ``M``, and
direct products of at most 16 of these joined by ``x`` or ``×``, e.g. ``A5xM``, ``S3xZ2`` or
``D8xZ3``. Any other name raises a one-line ``OptionError``.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass

import numpy as np

from implicitlm.core.errors import OptionError, quoted

# S8 (40320 elements) would need a 1.6e9-entry table; anything this large is refused.
MAX_TABLE_ENTRIES = 200_000_000
MAX_PERMUTATION_DEGREE = 8
MAX_CYCLIC_ORDER = 1000
# More factors than this could only add trivial ones (the table limit allows at most 13 of
# order 2 or more); the cap keeps a long name from building thousands of products.
MAX_FACTORS = 16

_FACTOR_PATTERN = re.compile(r"(?P<kind>[SADZ])(?P<n>[1-9][0-9]*)|M|SL\(2,3\)")
# A dihedral group's n-gon has at least 3 vertices (D1 and D2 would be Z2 and Z2 x Z2).
MIN_DIHEDRAL_DEGREE = 3
SPECIAL_LINEAR = "SL(2,3)"
_ACCEPTED_FORMS = (
    "S<n> or A<n> (1 <= n <= 8), D<n> (3 <= n <= 8), SL(2,3), Z<n> (1 <= n <= 1000), M, "
    f"or a direct product of up to {MAX_FACTORS} of these joined by 'x' or '×', e.g. 'A5xM'"
)

# The 4-element aperiodic monoid M of Schöne et al. (2025), elements E, A, B, X in that
# order; rows are the left operand. E is the identity, X is absorbing, B = B·B, A·A = X,
# B·A = A, A·B = X; every x satisfies x·x = x·x·x, so M is aperiodic and recognises only
# star-free languages. The authors call it the monoid of "no aa" over {a, b}; that
# language's syntactic monoid has 6 elements, so strictly M (a -> A, b -> B) recognises
# the coarser star-free language "an a only as the last letter" (product X otherwise).
_MONOID_M_TABLE = (
    (0, 1, 2, 3),
    (1, 3, 3, 3),
    (2, 1, 2, 3),
    (3, 3, 3, 3),
)


def smallest_uint_dtype(num_values: int) -> np.dtype:
    """The narrowest unsigned integer dtype that holds the values ``0 .. num_values-1``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if num_values - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


@dataclass(frozen=True, eq=False)
class FiniteAlgebra:
    """A finite group or monoid given by its multiplication table; identity is index 0.

    ``factor_orders`` lists the orders of the direct-product factors (one entry for a
    non-product), so the first factor's component of element ``i`` is
    ``i // (order // factor_orders[0])``.
    """

    name: str
    table: np.ndarray
    is_group: bool
    factor_orders: tuple[int, ...]

    @property
    def order(self) -> int:
        return int(self.table.shape[0])

    @property
    def identity(self) -> int:
        return 0

    def compose(self, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        """The product ``a * b`` (right operand applied first), elementwise over arrays."""
        return self.table[a, b]

    def inverse(self, i: np.ndarray | int) -> np.ndarray:
        if not self.is_group:
            raise OptionError(f"{self.name} is a monoid, not a group: elements have no inverses")
        return self._inverses[i]

    @functools.cached_property
    def _inverses(self) -> np.ndarray:
        return np.argmax(self.table == self.identity, axis=1).astype(self.table.dtype)


def get_group(name: str) -> FiniteAlgebra:
    """The group or monoid called ``name``; raises ``OptionError`` for an unknown name."""
    factors = _parse_factors(name)
    order = math.prod(_factor_order(factor) for factor in factors)
    if order * order > MAX_TABLE_ENTRIES:
        raise OptionError(
            f"group {quoted(name)} has {order} elements: its table would hold {order * order:.3g} "
            f"entries, more than the limit of {MAX_TABLE_ENTRIES:.0e}"
        )
    return _build_product(tuple(factors))


def resolve_group(group: str | FiniteAlgebra) -> FiniteAlgebra:
    return group if isinstance(group, FiniteAlgebra) else get_group(group)


def _parse_factors(name: str) -> list[str]:
    if not isinstance(name, str):
        raise OptionError(f"group name must be a string, got {quoted(name)}; expected {_ACCEPTED_FORMS}")
    factors = re.split("[x×]", name)
    if len(factors) > MAX_FACTORS or not all(_is_valid_factor(factor) for factor in factors):
        raise OptionError(f"unknown group name {quoted(name)}; expected {_ACCEPTED_FORMS}")
    return factors


def _is_valid_factor(factor: str) -> bool:
    match = _FACTOR_PATTERN.fullmatch(factor)
    if match is None:
        return False
    if factor in ("M", SPECIAL_LINEAR):
        return True
    limit = MAX_CYCLIC_ORDER if match["kind"] == "Z" else MAX_PERMUTATION_DEGREE
    # Compared as text first: int() refuses numbers of thousands of digits.
    if len(match["n"]) > len(str(limit)) or int(match["n"]) > limit:
        return False
    return match["kind"] != "D" or int(match["n"]) >= MIN_DIHEDRAL_DEGREE


def _factor_order(factor: str) -> int:
    if factor == "M":
        return len(_MONOID_M_TABLE)
    if factor == SPECIAL_LINEAR:
        return 24
    kind, n = factor[0], int(factor[1:])
    if kind == "D":
        return 2 * n
    if kind == "S":
        return math.factorial(n)
    if kind == "A":
        return max(1, math.factorial(n) // 2)
    return n


@functools.lru_cache(maxsize=None)
def _build_product(factors: tuple[str, ...]) -> FiniteAlgebra:
    # Folding from the left numbers (i, j, k) as (i*|H| + j)*|K| + k: lexicographic order.
    if len(factors) == 1:
        return _build_factor(factors[0])
    return _direct_product(_build_product(factors[:-1]), _build_factor(factors[-1]))


@functools.lru_cache(maxsize=None)
def _build_factor(factor: str) -> FiniteAlgebra:
    if factor == "M":
        table = np.array(_MONOID_M_TABLE, dtype=np.uint8)
        return _make_algebra("M", table, is_group=False)
    if factor == SPECIAL_LINEAR:
        return _make_algebra(factor, _permutation_table(_special_linear_permutations()), is_group=True)
    kind, n = factor[0], int(factor[1:])
    if kind == "Z":
        return _make_algebra(factor, _cyclic_table(n), is_group=True)
    if kind == "D":
        return _make_algebra(factor, _permutation_table(_dihedral_permutations(n)), is_group=True)
    perms = _lexicographic_permutations(n)
    if kind == "A":
        perms = perms[_is_even(perms)]
    return _make_algebra(factor, _permutation_table(perms), is_group=True)


def _make_algebra(name: str, table: np.ndarray, is_group: bool) -> FiniteAlgebra:
    return _frozen_algebra(name, table, is_group, (table.shape[0],))


def _frozen_algebra(
    name: str, table: np.ndarray, is_group: bool, factor_orders: tuple[int, ...]
) -> FiniteAlgebra:
    # Tables are cached and shared, so they must not be mutated by callers.
    table.setflags(write=False)
    return FiniteAlgebra(name, table, is_group, factor_orders)


def _cyclic_table(n: int) -> np.ndarray:
    # Rotation r_k[i] = (i + k) % n composes as r_a[r_b] = r_{a+b}, and r_k starts with k,
    # so lexicographic order is k: the rotation table is addition mod n.
    k = np.arange(n, dtype=np.int64)
    return ((k[:, None] + k[None, :]) % n).astype(smallest_uint_dtype(n))


def _lexicographic_permutations(n: int) -> np.ndarray:
    # itertools.permutations of a sorted range yields lexicographic order.
    return np.array(list(itertools.permutations(range(n))), dtype=np.uint8).reshape(-1, n)


def _dihedral_permutations(n: int) -> np.ndarray:
    """The n rotations i -> i + k and the n reflections i -> k - i of the n-gon's vertices
    (mod n), in lexicographic order."""
    vertices = np.arange(n)
    perms = [(vertices + k) % n for k in range(n)] + [(k - vertices) % n for k in range(n)]
    return _sorted_permutations(perms)


def _special_linear_permutations() -> np.ndarray:
    """SL(2,3) acting on the 8 non-zero vectors of F_3^2 (v -> M v), in lexicographic order.
    Composing the permutations of M and N gives that of M N, so the table is the group's."""
    vectors = [v for v in itertools.product(range(3), repeat=2) if any(v)]
    index = {v: i for i, v in enumerate(vectors)}
    perms = []
    for a, b, c, d in itertools.product(range(3), repeat=4):
        if (a * d - b * c) % 3 == 1:
            perms.append([index[((a * x + b * y) % 3, (c * x + d * y) % 3)] for x, y in vectors])
    return _sorted_permutations(perms)


def _sorted_permutations(perms: list) -> np.ndarray:
    return np.array(sorted(tuple(int(i) for i in perm) for perm in perms), dtype=np.uint8)


def _is_even(perms: np.ndarray) -> np.ndarray:
    n = perms.shape[1]
    upper = np.triu_indices(n, k=1)
    inversions = (perms[:, upper[0]] > perms[:, upper[1]]).sum(axis=1)
    return inversions % 2 == 0


def _permutation_table(perms: np.ndarray) -> np.ndarray:
    """Table of the permutations ``perms`` (rows, lexicographically sorted, closed)."""
    count, n = perms.shape
    weights = n ** np.arange(n - 1, -1, -1, dtype=np.int64)
    # Base-n keys of one-line arrays preserve lexicographic order and are < n**n (<= 8**8),
    # so a dense key -> index array replaces a search.
    index_of_key = np.zeros(n**n, dtype=np.int64)
    index_of_key[perms.astype(np.int64) @ weights] = np.arange(count)
    table = np.empty((count, count), dtype=smallest_uint_dtype(count))
    rows_per_block = max(1, 2**20 // count)
    for start in range(0, count, rows_per_block):
        left = perms[start : start + rows_per_block]
        composed = left[:, perms]  # composed[a, b, i] = perm_a[perm_b[i]]
        table[start : start + rows_per_block] = index_of_key[composed.astype(np.int64) @ weights]
    return table


def _direct_product(first: FiniteAlgebra, second: FiniteAlgebra) -> FiniteAlgebra:
    g, h = first.order, second.order
    dtype = smallest_uint_dtype(g * h)
    left = first.table.astype(dtype)[:, None, :, None] * dtype.type(h)
    table = (left + second.table.astype(dtype)[None, :, None, :]).reshape(g * h, g * h)
    return _frozen_algebra(
        f"{first.name}x{second.name}",
        table,
        first.is_group and second.is_group,
        first.factor_orders + second.factor_orders,
    )
