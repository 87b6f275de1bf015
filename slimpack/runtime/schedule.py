"""Per-stage op lists for a group: ``slimpack.schedules`` when present, else GPipe.

The schedule contract (owned by ``slimpack.schedules``): ``build_schedule(group)`` returns one
list of ``Op(kind "F"|"B", unit, chunk)`` per pipeline stage, ``unit`` indexing
``group.forward_units`` for F and ``group.backward_units`` for B, ``chunk`` the virtual stage
on that pipeline rank. The fallback is GPipe (every F in unit order, chunk by chunk, then every
B in backward-unit order, chunks reversed), which is valid for any plan; it is only used while
the schedules package is not importable, and the record says which one ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.plan import Group


@dataclass(frozen=True, kw_only=True, slots=True)
class FallbackOp:
    kind: str
    unit: int
    chunk: int


def gpipe_ops(group: Group) -> list[list[FallbackOp]]:
    ops = [FallbackOp(kind="F", unit=u, chunk=c)
           for c in range(group.vpp) for u in range(len(group.forward_units))]
    ops += [FallbackOp(kind="B", unit=u, chunk=c)
            for c in reversed(range(group.vpp)) for u in range(len(group.backward_units))]
    return [list(ops) for _ in range(group.pp)]


def build_group_schedule(group: Group) -> tuple[list[list], str]:
    """(op lists per stage, source): source is "slimpack.schedules" or "fallback-gpipe"."""
    try:
        from slimpack.schedules import build_schedule
    except ImportError:
        return gpipe_ops(group), "fallback-gpipe"
    return [list(stage_ops) for stage_ops in build_schedule(group)], "slimpack.schedules"
