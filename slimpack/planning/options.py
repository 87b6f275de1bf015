"""Building a planner's frozen options dataclass from ``**options`` with clear errors."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def build_options(cls: type[T], method: str, options: dict[str, Any]) -> T:
    """``cls(**options)``, but an unknown name raises ValueError listing the allowed ones."""
    allowed = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{method}: unknown option(s) {unknown}; allowed: {sorted(allowed)}")
    return cls(**options)


def require_positive_limit(method: str, time_limit_s: float) -> None:
    if not time_limit_s >= 0:
        raise ValueError(f"{method}: time_limit_s must be >= 0 seconds, got {time_limit_s}")
