"""The runtime's compiled dry run (:mod:`slimpack.runtime.dry_run_walk`) is the dry run
written in Python, stop for stop.

The oracle below is the walk op by op as :func:`slimpack.runtime.validate.dry_run_state`
states its rules (buffered sends, blocking receives, FIFO channels, same-sequence slice order,
the LM head's joins); the check is exact equality of where every stage stops, the heads
joined and completed, and the joins, over the groups every registered planner makes on real
length samples (with virtual stages), with the head on the last stage or spread over the
pipeline (eager joins and joins where stages block), and over schedules broken on purpose.
"""

from __future__ import annotations

import pytest

from slimpack.methods import method_names
from slimpack.plan import Group, Plan, PlanError
from slimpack.runtime.validate import _eager_joins, dry_run_state, runtime_refusal
from slimpack.schedules import Op, build_schedule
from slimpack.specs import model_preset

MODEL = model_preset("llama-7b")


def _oracle(group: Group, ops: list[list[Op]], *, vocab_over_pp: bool,
            fixed: list[list[tuple[int, int]]] | None = None):
    """The dry run op by op: (ops each stage ran, heads joined per stage, heads done, joins)."""
    pp, vpp, last = group.pp, group.vpp, group.pp * group.vpp - 1
    fwd = [u.slice_ids for u in group.forward_units]
    bwd = [u.slice_ids for u in group.backward_units]
    pieces: dict[int, list[tuple[int, int]]] = {}
    for sl in group.slices:
        for seg in sl.segments:
            pieces.setdefault(seg.seq_id, []).append((seg.start, sl.slice_id))
    earlier: dict[int, set[int]] = {}
    later: dict[int, set[int]] = {}
    for of_seq in pieces.values():
        for start_a, a in of_seq:
            for start_b, b in of_seq:
                if start_b < start_a and a != b:
                    earlier.setdefault(a, set()).add(b)
                    later.setdefault(b, set()).add(a)
    channels: dict[tuple[int, int, str], list[tuple[int, int]]] = {}
    done_f = [[set() for _ in range(vpp)] for _ in range(pp)]
    done_b = [[set() for _ in range(vpp)] for _ in range(pp)]
    pos = [0] * pp

    def in_order(ids, needs, done) -> bool:
        seen = set()
        for i in ids:
            if any(x not in done and x not in seen for x in needs.get(i, ())):
                return False
            seen.add(i)
        return True

    def front(key, msg) -> bool:
        queue = channels.get(key)
        return bool(queue) and queue[0] == msg

    def ready(s: int, op: Op) -> bool:
        block = op.chunk * pp + s
        if op.kind == "F":
            if not in_order(fwd[op.unit], earlier, done_f[s][op.chunk]):
                return False
            return block == 0 or front(((s - 1) % pp, s, "F"), (op.unit, block))
        if any(i not in done_f[s][op.chunk] for i in bwd[op.unit]):
            return False
        if not in_order(bwd[op.unit], later, done_b[s][op.chunk]):
            return False
        return block == last or front(((s + 1) % pp, s, "B"), (op.unit, block))

    def run(s: int, op: Op) -> None:
        block = op.chunk * pp + s
        if op.kind == "F":
            if block > 0:
                channels[((s - 1) % pp, s, "F")].pop(0)
            done_f[s][op.chunk].update(fwd[op.unit])
            if block < last:
                channels.setdefault((s, (s + 1) % pp, "F"), []).append((op.unit, block + 1))
        else:
            if block < last:
                channels[((s + 1) % pp, s, "B")].pop(0)
            done_b[s][op.chunk].update(bwd[op.unit])
            if block > 0:
                channels.setdefault((s, (s - 1) % pp, "B"), []).append((op.unit, block - 1))

    def is_head(s: int, op: Op) -> bool:
        return vocab_over_pp and s == pp - 1 and op.kind == "F" and op.chunk == vpp - 1

    heads_done, joined, taken = 0, [0] * pp, [0] * pp
    joins: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    while True:
        progress = False
        for s in range(pp):
            while joined[s] <= heads_done:
                if (fixed is not None and s < pp - 1 and taken[s] < len(fixed[s])
                        and fixed[s][taken[s]][0] == pos[s]):
                    joins[s].append(fixed[s][taken[s]])
                    taken[s] += 1
                    joined[s] += 1
                    progress = True
                    continue
                if pos[s] == len(ops[s]) or not ready(s, ops[s][pos[s]]):
                    break
                op = ops[s][pos[s]]
                if is_head(s, op):
                    if any(joined[t] <= heads_done for t in range(pp - 1)):
                        break
                    heads_done += 1
                    joined[s] = heads_done
                run(s, op)
                pos[s] += 1
                progress = True
        if progress:
            continue
        head = ops[pp - 1][pos[pp - 1]] if pos[pp - 1] < len(ops[pp - 1]) else None
        if fixed is not None or head is None or not is_head(pp - 1, head) \
                or not ready(pp - 1, head):
            break
        for t in range(pp - 1):
            joins[t].append((pos[t], head.unit))
            joined[t] += 1
    return pos, joined, heads_done, joins


@pytest.fixture(scope="module")
def plans(registered_planner_plans) -> list[Plan]:
    """Every registered planner's plans of real length samples (``tests/conftest.py``:
    llama-7b on H800 as ``MODEL``/``HW`` here, tp2 cp2 pp4 dp2, vpp 2 for the pipeline
    planners)."""
    return registered_planner_plans


def _check(group: Group, ops: list[list[Op]], **kwargs) -> tuple:
    got = dry_run_state(group, ops, **kwargs)
    assert got == _oracle(group, ops, **kwargs)
    return got


def test_dry_run_stops_where_the_walk_op_by_op_does(plans):
    checked, slice_order, free_joins = set(), 0, 0
    for plan in plans:
        for group in plan.groups():
            ops = build_schedule(group)
            pos, _, _, joins = _check(group, ops, vocab_over_pp=False)
            assert pos == [len(x) for x in ops] and joins == [[] for _ in ops]
            slice_order += any(len(u.slice_ids) > 1 for u in group.forward_units)
            if group.pp > 1:
                eager = _eager_joins(group, ops)
                if eager is not None:
                    _check(group, ops, vocab_over_pp=True, fixed=eager)
                _, _, heads, joins = _check(group, ops, vocab_over_pp=True)
                free_joins += heads > 0 and any(joins)
                # Broken on purpose: stage 0 first waits for its last backward (a deadlock),
                # and the last stage's first two forwards swapped (messages out of order).
                stuck = [list(stage) for stage in ops]
                stuck[0] = stuck[0][-1:] + stuck[0][:-1]
                assert _check(group, stuck, vocab_over_pp=True)[0][0] == 0
                swapped = [list(stage) for stage in ops]
                swapped[-1][:2] = swapped[-1][1::-1]
                if swapped[-1][:2] != list(ops[-1][:2]):
                    got = _check(group, swapped, vocab_over_pp=False)[0]
                    assert got != [len(x) for x in ops]
            checked.add((plan.method, group.vpp))
    assert {m for m, _ in checked} == set(method_names())
    assert {(m, 2) for m in ("megatron", "slimpack", "slimpipe")} <= checked
    assert slice_order and free_joins  # units of several slices; heads joined where blocked


def test_dry_run_refuses_ops_outside_the_group(plans):
    """Compiled code has no bounds checks: an op naming a unit or chunk the group does not
    have is refused before the walk runs."""
    plan = next(p for p in plans if p.method == "megatron" and p.parallel.pp > 1)
    group = next(plan.groups())
    ops = [list(stage) for stage in build_schedule(group)]
    ops[0].append(Op("F", len(group.forward_units), 0))
    with pytest.raises(PlanError, match="units below"):
        dry_run_state(group, ops, vocab_over_pp=False)
    ops[0][-1] = Op("B", 0, group.vpp)
    with pytest.raises(PlanError, match="chunks below"):
        dry_run_state(group, ops, vocab_over_pp=False)


def test_every_registered_planners_plan_runs(plans):
    assert [runtime_refusal(p, MODEL) for p in plans] == [""] * len(plans)
