"""Time limits for planners: training never waits on a solver (docs/methods.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class Deadline:
    """A wall-clock budget started at construction (``time.perf_counter`` seconds)."""

    time_limit_s: float
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if not self.time_limit_s >= 0:
            raise ValueError(f"time_limit_s must be >= 0 seconds, got {self.time_limit_s}")

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.time_limit_s - self.elapsed_s)

    @property
    def expired(self) -> bool:
        return self.remaining_s <= 0.0

    def share(self, parts_left: int) -> float:
        """An even share of the remaining time for the next of ``parts_left`` solves."""
        return self.remaining_s / max(parts_left, 1)
