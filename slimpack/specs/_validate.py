"""Shared field checks for the spec dataclasses: each raises ValueError naming the field."""

from __future__ import annotations


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
