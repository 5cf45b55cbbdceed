"""Checks of the numbers adapters read from run_options and request options: a ValueError naming the option when a
value is not one the option takes (bools are not numbers here, though Python counts them as ints)."""

from __future__ import annotations

from typing import Any


def probability(value: Any, where: str) -> float:
    """A number from 0 to 1 (a threshold)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{where}: must be a number from 0 to 1, got {value!r}")
    return float(value)


def whole_number(value: Any, where: str, low: int, high: int) -> int:
    """A whole number from `low` to `high` (JSON sends 3 as 3.0 through a Struct)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not low <= value <= high
        or value != int(value)
    ):
        raise ValueError(f"{where}: must be a whole number from {low} to {high}, got {value!r}")
    return int(value)
