"""Checks that per-stage op lists are complete, causal and deadlock-free.

``validate_schedule`` is what both consumers rely on: the simulator runs it before timing a
custom schedule and the runtime before executing one with blocking point-to-point calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slimpack.plan import Group, PlanError
from slimpack.schedules.dependency_walk import walk_ticks
from slimpack.schedules.ops import Op, OpArrays, op_arrays


class ScheduleError(PlanError):
    """Op lists that miss or repeat an op, break a causal rule or cannot make progress."""


def validate_schedule(group: Group, ops: list[list[Op]]) -> None:
    """Raise :class:`ScheduleError` unless ``ops`` is a valid schedule of ``group``.

    Checked: one op list per stage; every ``F(u, c)`` and ``B(u, c)`` exactly once per stage;
    on each stage and chunk, a sequence's slices are forwarded in increasing and backwarded in
    decreasing ``start`` order (KV cache and dK/dV flow), a slice's B follows its F; and the
    stages together can run to completion when each executes its list in order (no cycle
    between the lists and the cross-stage activation/gradient edges).
    """
    gid = group.group_id
    if len(ops) != group.pp:
        raise ScheduleError(f"Group {gid}: schedule has {len(ops)} stage lists, pp = {group.pp}")
    expected = {("F", u, c) for u in range(len(group.forward_units)) for c in range(group.vpp)}
    expected |= {("B", u, c) for u in range(len(group.backward_units)) for c in range(group.vpp)}
    fwd_segments = [[(seg.seq_id, seg.start) for sid in unit.slice_ids
                     for seg in group.slice(sid).segments] for unit in group.forward_units]
    bwd_segments = [[(seg.seq_id, seg.start) for sid in unit.slice_ids
                     for seg in group.slice(sid).segments] for unit in group.backward_units]
    for stage, stage_ops in enumerate(ops):
        seen = {(op.kind, op.unit, op.chunk) for op in stage_ops}
        if len(seen) != len(stage_ops):
            dup = _first_duplicate(stage_ops)
            raise ScheduleError(f"Group {gid} stage {stage}: {dup} appears more than once")
        if seen != expected:
            missing = sorted(expected - seen)[:5]
            extra = sorted(seen - expected)[:5]
            raise ScheduleError(
                f"Group {gid} stage {stage}: ops missing {missing} / unknown {extra} "
                f"({len(group.forward_units)} forward units, {len(group.backward_units)} "
                f"backward units, vpp {group.vpp})"
            )
        _check_stage_causality(gid, stage, stage_ops, fwd_segments, bwd_segments, group)
    stuck = find_deadlock(group, ops)
    if stuck:
        raise ScheduleError(f"Group {gid}: schedule deadlocks; {stuck}")


def _first_duplicate(stage_ops: list[Op]) -> Op:
    seen: set[Op] = set()
    for op in stage_ops:
        if op in seen:
            return op
        seen.add(op)
    raise AssertionError("no duplicate")


def _check_stage_causality(gid: int, stage: int, stage_ops: list[Op],
                           fwd_segments: list[list[tuple[int, int]]],
                           bwd_segments: list[list[tuple[int, int]]], group: Group) -> None:
    last_fwd: dict[tuple[int, int], int] = {}
    last_bwd: dict[tuple[int, int], int] = {}
    forwarded: set[tuple[int, int]] = set()  # (slice_id, chunk)
    for op in stage_ops:
        if op.kind == "F":
            for seq, start in fwd_segments[op.unit]:
                prev = last_fwd.get((seq, op.chunk), -1)
                if start < prev:
                    raise ScheduleError(
                        f"Group {gid} stage {stage}: {op} forwards seq {seq} at {start} after "
                        f"its later segment at {prev}; the KV cache needs increasing order")
                last_fwd[(seq, op.chunk)] = start
            forwarded.update((sid, op.chunk) for sid in group.forward_units[op.unit].slice_ids)
        else:
            for sid in group.backward_units[op.unit].slice_ids:
                if (sid, op.chunk) not in forwarded:
                    raise ScheduleError(
                        f"Group {gid} stage {stage}: {op} runs before slice {sid} was "
                        f"forwarded on chunk {op.chunk}")
            for seq, start in bwd_segments[op.unit]:
                prev = last_bwd.get((seq, op.chunk))
                if prev is not None and start > prev:
                    raise ScheduleError(
                        f"Group {gid} stage {stage}: {op} backwards seq {seq} at {start} after "
                        f"its earlier segment at {prev}; dK/dV needs reverse order")
                last_bwd[(seq, op.chunk)] = start


def find_deadlock(group: Group, ops: list[list[Op]]) -> str | None:
    """Run the lists with zero durations; describe the stuck op of each stage, or None."""
    pos = progress(group, ops)
    if all(pos[s] == len(ops[s]) for s in range(group.pp)):
        return None
    return describe_stuck(ops, pos, group.pp)


def progress(group: Group, ops: list[list[Op]]) -> list[int]:
    """How many ops of each stage's list can run (all of them unless it deadlocks).

    Cross-stage edges: F on virtual stage ``vs`` needs F of the same unit on ``vs - 1``; B on
    ``vs`` needs B of the same unit on ``vs + 1``. (Same-stage edges are list order, checked by
    :func:`validate_schedule`.)
    """
    return unit_time_walk(ops, pp=group.pp, vpp=group.vpp)[0]


def unit_time_walk(ops: Sequence[Sequence[Op]], *, pp: int,
                   vpp: int) -> tuple[list[int], list[list[int]]]:
    """Run the op lists with every op taking one tick and free transfers: (how many ops of
    each stage ran, the start tick of each op that ran, ``[stage][position]``).

    The dependencies of the timing walk (:mod:`slimpack.sim.engine`): list order on a stage,
    F on virtual stage ``vs`` after F on ``vs - 1``, B on ``vs`` after B on ``vs + 1``. Each
    stage blocks on at most one missing input at a time, so a worklist visits every op once:
    O(ops). The one home of this walk: the deadlock check (:func:`progress`) and SlimPipe's
    concurrency (``slimpack.sim.redistribution.schedule_ticks``) both read it.
    """
    ran, ticks, stage_first = walk_op_arrays([op_arrays(stage_ops) for stage_ops in ops],
                                             pp=pp, vpp=vpp)
    # Ops that never ran keep tick 0, as the lists the walk fills in place did.
    return ran.tolist(), [np.maximum(ticks[a:b], 0).tolist()
                          for a, b in zip(stage_first[:-1], stage_first[1:], strict=True)]


def walk_op_arrays(arrays: Sequence[OpArrays], *, pp: int,
                   vpp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`unit_time_walk` over each stage's :func:`op_arrays`: (ops each stage ran, start
    tick of each op flat in stage order (-1: never ran), each stage's first flat index and one
    past the last). The schedule builder's deadlock check runs it on index orders without
    building ops."""
    num_vs = pp * vpp
    stage_first = np.zeros(pp + 1, dtype=np.int64)
    stage_first[1:] = np.cumsum([len(a[0]) for a in arrays])
    if not stage_first[-1]:
        return np.zeros(pp, dtype=np.int64), np.zeros(0, dtype=np.int64), stage_first
    is_fwd, unit, chunk = (np.concatenate([a[k] for a in arrays]) for k in range(3))
    if unit.min() < 0 or chunk.min() < 0 or chunk.max() >= vpp:
        # The compiled walk indexes arrays by these without bounds checks.
        raise ScheduleError(f"unit_time_walk: ops need unit >= 0 and chunk in [0, {vpp}), got "
                            f"units {unit.min()}..{unit.max()}, chunks "
                            f"{chunk.min()}..{chunk.max()}")
    # (kind, unit, virtual stage) as one int, (unit * num_vs + vs) * 2 + is_backward; an op's
    # input is the same op one virtual stage before (F) or after (B), or none (``size``).
    vs = chunk * pp + np.repeat(np.arange(pp, dtype=np.int64), np.diff(stage_first))
    key = (unit * num_vs + vs) * 2 + ~is_fwd
    size = 2 * num_vs * (int(unit.max()) + 1)
    need = np.where(is_fwd, np.where(vs > 0, key - 2, size),
                    np.where(vs < num_vs - 1, key + 2, size))
    ran, ticks = walk_ticks(stage_first, key, need, size)
    return ran, ticks, stage_first


def describe_stuck(ops: list[list[Op]], pos: list[int], pp: int) -> str:
    """One clause per unfinished stage: its next op and the input it waits for."""
    parts = []
    for stage, stage_ops in enumerate(ops):
        if pos[stage] >= len(stage_ops):
            continue
        op = stage_ops[pos[stage]]
        vs = op.chunk * pp + stage
        src_vs = vs - 1 if op.kind == "F" else vs + 1
        what = "activation" if op.kind == "F" else "gradient"
        parts.append(f"stage {stage} stuck at op #{pos[stage]} {op} waiting for the {what} "
                     f"of stage {src_vs % pp} chunk {src_vs // pp}")
    return "; ".join(parts)
