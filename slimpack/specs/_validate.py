"""Shared field checks for the spec dataclasses: each raises ValueError naming the field."""

from __future__ import annotations

import numbers


def require_int(owner: str, name: str, value: object) -> int:
    """``value`` as a Python int; ValueError unless it is an integer (numpy integers count;
    bools and floats do not, even 2.0: a float count is a bug upstream, not a rounding)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}.{name} must be an integer, got {value!r} "
                         f"({type(value).__name__})")
    return int(value)


def require_positive(owner: str, name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{owner}.{name} must be > 0, got {value!r}")


def require_non_negative(owner: str, name: str, value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{owner}.{name} must be >= 0, got {value!r}")


def require_fraction(owner: str, name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{owner}.{name} must be in (0, 1], got {value!r}")


def unknown_preset(kind: str, name: str, known: list[str]) -> ValueError:
    return ValueError(f"unknown {kind} preset {name!r}; allowed: {', '.join(sorted(known))}")
