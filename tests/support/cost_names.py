"""The one name of what a fixed-point solve spends: passes (one evaluation of the map each)."""

from __future__ import annotations

from typing import Any

# The words records, tables and logs used for it before it had one name.
FORMER_WORDS = ("iteration", "evaluation")


def former_cost_names(value: Any) -> list[str]:
    """Every key and text anywhere in ``value`` (a JSON value or a printed table) that names a
    solve's cost by a former word."""
    if isinstance(value, dict):
        return [name for key, item in value.items() for name in former_cost_names(key) + former_cost_names(item)]
    if isinstance(value, list):
        return [name for item in value for name in former_cost_names(item)]
    if isinstance(value, str):
        return [value] if any(word in value.lower() for word in FORMER_WORDS) else []
    return []
