"""Time limits for planners: training never waits on a solver (docs/methods.md).

A limit is a wall-clock *safety net* for interactive use. Nothing that reaches a record may
depend on it (its answer would depend on the machine's load), so the harness plans with
``time_limit_s=None``: no net, the planners' count limits (MILP nodes, trials, candidates)
alone bound the work. A planner whose net was reached says so in ``metadata['fallback']``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class Deadline:
    """A wall-clock budget started at construction (``time.perf_counter`` seconds); ``None``
    is no budget: it never expires and ``remaining_s`` is infinite."""

    time_limit_s: float | None
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ValueError(f"time_limit_s must be >= 0 seconds or None, got {self.time_limit_s}")

    @property
    def unlimited(self) -> bool:
        return self.time_limit_s is None

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    @property
    def remaining_s(self) -> float:
        if self.time_limit_s is None:
            return math.inf
        return max(0.0, self.time_limit_s - self.elapsed_s)

    @property
    def expired(self) -> bool:
        return self.time_limit_s is not None and self.remaining_s <= 0.0

    def share(self, parts_left: int) -> float:
        """An even share of the remaining time for the next of ``parts_left`` solves."""
        return self.remaining_s / max(parts_left, 1)


WALL_CLOCK_FALLBACK = ("wall-clock safety net reached (time_limit_s={limit:g} s): the answer "
                       "depends on this machine's speed and load")
"""``metadata['fallback']`` of a plan whose search the wall-clock net cut short."""
