"""The compiled walks are the walks written in Python, bit for bit.

The timing walk (:func:`slimpack.sim.engine.run_group` over :mod:`slimpack.sim.timing_walk`)
and the unit-time walk (:func:`slimpack.schedules.validate.unit_time_walk` and the schedule
builder's deadlock check, over :mod:`slimpack.schedules.dependency_walk`) run compiled. The
oracles below are the same walks written op by op in plain Python, as the rules in the
modules' docstrings read; the check is exact equality (floats compared with ``==``, the trace
op for op), over the groups every registered planner makes on real length samples, with
virtual stages, blocking sends and offload.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from slimpack.cost import AnalyticCostModel
from slimpack.methods import method_names
from slimpack.plan import Group, Plan
from slimpack.records import OpTiming
from slimpack.schedules import Op, build_schedule
from slimpack.schedules.ops import OpList, op_arrays
from slimpack.schedules.validate import unit_time_walk
from slimpack.sim.costs import GroupCosts, group_costs, with_host_copies
from slimpack.sim.engine import DeadlockError, run_group
from slimpack.sim.memory import group_memory
from slimpack.specs import hardware_preset, model_preset

MODEL, HW = model_preset("llama-7b"), hardware_preset("h800")
COST = AnalyticCostModel(model=MODEL, hardware=HW)


def _timing_oracle(group_id: int, ops: list[list[Op]], costs: GroupCosts, start_s: list[float]):
    """List scheduling op by op: a stage runs its list in order; an op starts when its lane
    is free and its input has arrived (F after F of the unit one virtual stage before, B
    after B one after); a send leaves when the op ends and its lane is free, and with
    blocking sends the stage's lane waits for it. Stages are visited from a last-in-first-out
    work list, a blocked stage parked on its missing input."""
    pp = len(ops)
    num_vs = len(costs.layers)
    arrival: dict[tuple[str, int, int], float] = {}
    waiting: dict[tuple[str, int, int], int] = {}
    pos, free = [0] * pp, list(start_s)
    send_next, send_prev = list(start_s), list(start_s)
    busy, last_b = [0.0] * pp, [0.0] * pp
    trace: list[OpTiming] = []
    work = list(range(pp - 1, -1, -1))
    while work:
        s = work.pop()
        while pos[s] < len(ops[s]):
            op = ops[s][pos[s]]
            vs = op.chunk * pp + s
            fwd = op.kind == "F"
            source = vs - 1 if fwd else vs + 1
            if 0 <= source < num_vs:
                key = (op.kind, source, op.unit)
                if key not in arrival:
                    waiting[key] = s
                    break
                start = max(arrival[key], free[s])
            else:
                start = free[s]
            end = start + (costs.fwd_s if fwd else costs.bwd_s)[vs][op.unit]
            lane_end = end
            if not fwd:
                last_b[s] = start
            target = vs + 1 if fwd else vs - 1
            if 0 <= target < num_vs:
                arrive = end
                if pp > 1:
                    lane = send_next if fwd else send_prev
                    t0 = max(end, lane[s])
                    arrive = t0 + (costs.fwd_send_s if fwd else costs.bwd_send_s)[s][op.unit]
                    lane[s] = arrive
                    if costs.blocking_sends:
                        lane_end = arrive
                    trace.append(OpTiming(stage=s, kind=f"send-{op.kind}", unit=op.unit,
                                          chunk=op.chunk, start_s=t0, end_s=arrive,
                                          lane="send-next" if fwd else "send-prev",
                                          group=group_id))
                key = (op.kind, vs, op.unit)
                arrival[key] = arrive
                if key in waiting:
                    work.append(waiting.pop(key))
            busy[s] += end - start
            trace.append(OpTiming(stage=s, kind=op.kind, unit=op.unit, chunk=op.chunk,
                                  start_s=start, end_s=end, group=group_id))
            free[s] = lane_end
            pos[s] += 1
    return pos, free, last_b, busy, trace


def _ticks_oracle(ops: list[list[Op]], pp: int) -> tuple[list[int], list[list[int]]]:
    """The unit-time walk op by op: every op takes one tick, transfers are free."""
    done: dict[tuple[str, int, int], int] = {}
    waiting: dict[tuple[str, int, int], int] = {}
    num_vs = 1 + max((op.chunk * pp + s for s, stage in enumerate(ops) for op in stage),
                     default=0)
    ticks = [[0] * len(stage) for stage in ops]
    pos, free = [0] * pp, [0] * pp
    work = list(range(pp - 1, -1, -1))
    while work:
        s = work.pop()
        while pos[s] < len(ops[s]):
            op = ops[s][pos[s]]
            vs = op.chunk * pp + s
            start = free[s]
            source = vs - 1 if op.kind == "F" else vs + 1
            if (op.kind == "F" and vs > 0) or (op.kind == "B" and vs < num_vs - 1):
                key = (op.kind, source, op.unit)
                if key not in done:
                    waiting[key] = s
                    break
                start = max(start, done[key])
            ticks[s][pos[s]] = start
            free[s] = start + 1
            key = (op.kind, vs, op.unit)
            done[key] = start + 1
            pos[s] += 1
            if key in waiting:
                work.append(waiting.pop(key))
    return pos, ticks


@pytest.fixture(scope="module")
def plans(registered_planner_plans) -> list[Plan]:
    """Every registered planner's plans of real length samples (``tests/conftest.py``:
    llama-7b on H800 as ``MODEL``/``HW`` here, tp2 cp2 pp4 dp2, vpp 2 for the pipeline
    planners)."""
    return registered_planner_plans


def _costs(group: Group, *, blocking: bool, offload: bool) -> GroupCosts:
    costs = group_costs(group, model=MODEL, cost=COST, gpus_per_node=8)
    if offload:
        memory = group_memory(dataclasses.replace(group, offload=0.5), model=MODEL, dp=2)
        costs = with_host_copies(costs, fwd_offload=memory.fwd_offload,
                                 bwd_fetch=memory.bwd_fetch, host_link_gbps=HW.host_link_gbps)
    return dataclasses.replace(costs, blocking_sends=blocking)


def test_timing_walk_is_the_walk_op_by_op(plans):
    checked = set()
    for plan in plans:
        for group in plan.groups():
            ops = build_schedule(group)
            memory = group_memory(group, model=MODEL, dp=2)
            start = [0.25 * s for s in range(group.pp)]  # lanes freed at different times
            for blocking, offload in ((False, False), (True, False), (False, True)):
                costs = _costs(group, blocking=blocking, offload=offload)
                got = run_group(group_id=group.group_id, ops=ops, costs=costs, memory=memory,
                                start_s=start, record=True)
                pos, free, last_b, busy, trace = _timing_oracle(group.group_id, ops, costs,
                                                                start)
                assert pos == [len(x) for x in ops]
                assert got.compute_end == free, plan.method
                assert got.last_backward_start == last_b, plan.method
                assert got.busy_s == busy, plan.method
                assert got.ops == trace, plan.method
            checked.add((plan.method, group.vpp))
    assert {m for m, _ in checked} == set(method_names())
    assert {(m, 2) for m in ("megatron", "slimpack", "slimpipe")} <= checked


def test_timing_walk_names_the_stuck_ops_of_a_deadlock(plans):
    plan = next(p for p in plans if p.method == "megatron" and p.parallel.pp > 1)
    group = next(plan.groups())
    ops = [list(stage) for stage in build_schedule(group)]
    ops[0] = ops[0][-1:] + ops[0][:-1]  # stage 0 first waits for its last backward: stuck
    with pytest.raises(DeadlockError, match="deadlocked"):
        run_group(group_id=group.group_id, ops=ops, costs=_costs(group, blocking=False,
                                                                 offload=False),
                  memory=group_memory(group, model=MODEL, dp=2), start_s=[0.0] * group.pp,
                  record=False)


def test_unit_time_walk_is_the_walk_op_by_op(plans):
    for plan in plans:
        for group in plan.groups():
            ops = build_schedule(group)
            assert unit_time_walk(ops, pp=group.pp, vpp=group.vpp) == \
                _ticks_oracle(ops, group.pp), plan.method
            if group.pp > 1:  # a deadlock: the walks stop at the same ops, same ticks
                stuck = [list(stage) for stage in ops]
                stuck[0] = stuck[0][-1:] + stuck[0][:-1]
                got = unit_time_walk(stuck, pp=group.pp, vpp=group.vpp)
                assert got == _ticks_oracle(stuck, group.pp), plan.method
                assert got[0][0] == 0


def test_built_op_lists_carry_their_fields(plans):
    """``build_schedule``'s lists are their arrays: the ops made from them read back the same
    fields, a copy is a plain list of those ops, and the lists cannot change."""
    for plan in plans:
        for group in plan.groups():
            for stage_ops in build_schedule(group):
                assert type(stage_ops) is OpList
                carried = op_arrays(stage_ops)
                copy = list(stage_ops)
                assert type(copy) is list and copy == stage_ops and stage_ops == copy
                assert len(copy) == len(stage_ops) and copy[-1:] == stage_ops[-1:]
                read = op_arrays(copy)
                for a, b in zip(carried, read, strict=True):
                    assert a.dtype == b.dtype and np.array_equal(a, b)
                assert not carried[1].flags.writeable
    built = build_schedule(next(plans[0].groups()))[0]
    assert not hasattr(built, "append")
    with pytest.raises(TypeError):
        built[0] = Op("F", 0, 0)
    assert built != [*built, Op("F", 0, 0)]


def test_walks_refuse_ops_outside_the_group(plans):
    """Compiled code has no bounds checks: an op naming a unit or chunk the group does not
    have is refused before either walk runs."""
    plan = next(p for p in plans if p.method == "megatron" and p.parallel.pp > 1)
    group = next(plan.groups())
    ops = [list(stage) for stage in build_schedule(group)]
    ops[0].append(Op("F", len(group.forward_units), 0))
    with pytest.raises(ValueError, match="units below"):
        run_group(group_id=group.group_id, ops=ops,
                  costs=_costs(group, blocking=False, offload=False),
                  memory=group_memory(group, model=MODEL, dp=2), start_s=[0.0] * group.pp,
                  record=False)
    ops[0][-1] = Op("F", 0, group.vpp)
    with pytest.raises(ValueError, match="chunk"):
        unit_time_walk(ops, pp=group.pp, vpp=group.vpp)
