"""A solve's residuals: per-sample norms, and the lowest tolerance a map's precision can reach."""

from __future__ import annotations

import torch

from .stats import LOGGER


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """Each sample's Euclidean norm, accumulated in at least float32 (a half-precision sum
    of squares over a sequence overflows float16 and rounds away bfloat16's last digits)."""
    return torch.linalg.vector_norm(x.flatten(1), dim=1, dtype=torch.promote_types(x.dtype, torch.float32))


# The lowest relative residual a solve is held to, in units of the map's machine epsilon.
# f(z) is rounded at every element, so |f(z) - z| / |f(z)| stalls at the rounding of one
# pass: measured 0.2-0.4 eps in bfloat16 and float16 and up to 0.9 eps in float32, for
# 1- and 2-block models of every family (benchmarks/RESULTS.md, "Half precision"); twice
# the epsilon leaves room for deeper stacks, which round more often per pass.
RESIDUAL_FLOOR_EPSILONS = 2.0


def residual_floor(dtype: torch.dtype) -> float:
    """The lowest tolerance a solve whose map computes in ``dtype`` is held to: a lower one
    would not be reached, and every solve would spin to its budget (bfloat16: 1.6e-2,
    float16: 2.0e-3, float32: 2.4e-7; float64: below any tolerance in use)."""
    return RESIDUAL_FLOOR_EPSILONS * torch.finfo(dtype).eps


_RAISED_TOLERANCES: set[tuple[torch.dtype, float]] = set()


def held_tolerance(tol: float, dtype: torch.dtype) -> float:
    """``tol``, or the floor of ``dtype`` where it is lower: said once per process for each
    (dtype, tolerance), not at every solve."""
    floor = residual_floor(dtype)
    if tol >= floor:
        return tol
    if (dtype, tol) not in _RAISED_TOLERANCES:
        _RAISED_TOLERANCES.add((dtype, tol))
        name = str(dtype).removeprefix("torch.")
        LOGGER.warning(f"fixed-point tolerance {tol:g} is below what a {name} map can reach: holding {floor:.3g} "
                       f"(twice {name}'s machine epsilon)")
    return floor


def computed_dtype(z: torch.Tensor) -> torch.dtype:
    """The precision the map computes in: autocast's, where it is on for ``z``'s device
    (the iterate stays float32 but every matrix product rounds to bfloat16), else ``z``'s."""
    device = z.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return z.dtype
