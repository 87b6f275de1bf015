"""Per-stage op lists for a group: the suite's schedules, the same lists the simulator times.

The schedule contract (owned by ``slimpack.schedules``): ``build_schedule(group)`` returns one
list of ``Op(kind "F"|"B", unit, chunk)`` per pipeline stage, ``unit`` indexing
``group.forward_units`` for F and ``group.backward_units`` for B, ``chunk`` the virtual stage
on that pipeline rank. There is no fallback order: a runtime that ran another schedule than
the simulator priced would measure a different step.
"""

from __future__ import annotations

from slimpack.plan import Group
from slimpack.schedules import Op, build_schedule

SCHEDULE_SOURCE = "slimpack.schedules"
"""What run records name as the schedule's source (``RuntimePlan.schedule_source``)."""


def build_group_schedule(group: Group) -> list[list[Op]]:
    """The group's op lists, one per pipeline stage (the builder's own: never changed)."""
    return build_schedule(group)
