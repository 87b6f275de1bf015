"""Pipeline schedules: pure functions from a plan group to per-stage op lists.

The simulator times these lists and the runtime executes them, so both run the same order.
No torch here.
"""

from slimpack.schedules.ops import Op, OpKind, virtual_stage
from slimpack.schedules.orders import backward_order, forward_groups, forward_order
from slimpack.schedules.pipeline import build_schedule, stage_forward_counts
from slimpack.schedules.validate import (
    ScheduleError,
    describe_stuck,
    find_deadlock,
    progress,
    validate_schedule,
)

__all__ = [
    "Op",
    "OpKind",
    "ScheduleError",
    "backward_order",
    "build_schedule",
    "describe_stuck",
    "find_deadlock",
    "forward_groups",
    "forward_order",
    "progress",
    "stage_forward_counts",
    "validate_schedule",
    "virtual_stage",
]
