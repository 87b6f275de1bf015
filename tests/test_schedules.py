"""Schedule builders: warm-up counts from the papers' artifacts, causality, deadlock-freedom.

Warm-up counts (forwards before the first backward on pipeline rank r of p): Megatron-LM 1F1B
``p - r``; interleaved ``2(p-1-r) + (v-1)p + 1``; SlimPipe ``n*v + 2(p-1-r)`` (docs/cost-model.md
table, SlimPipe artifact).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.plan import Group, Segment, Slice, Unit
from slimpack.schedules import (
    Op,
    ScheduleError,
    build_schedule,
    find_deadlock,
    validate_schedule,
)
from slimpack.sim.synthetic import uniform_plan


def _group(schedule: str, *, pp: int, vpp: int = 1, slices: int = 1, m: int = 4) -> Group:
    plan = uniform_plan(schedule=schedule, pp=pp, vpp=vpp, slices=slices, microbatches=m)
    return next(plan.validate().groups())


def _forwards_before_first_backward(ops: list[Op]) -> int:
    return next(i for i, op in enumerate(ops) if op.kind == "B")


def test_op_is_frozen_and_hashable():
    op = Op("F", 3, 1)
    assert (op.kind, op.unit, op.chunk) == ("F", 3, 1)
    assert {op, Op("F", 3, 1)} == {op}
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.unit = 4  # type: ignore[misc]


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (3, 2)])
def test_1f1b_warmup_is_p_minus_r(p, m):
    ops = build_schedule(_group("1f1b", pp=p, m=m))
    assert [_forwards_before_first_backward(o) for o in ops] == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (8, 5, 8), (2, 3, 4)])
def test_interleaved_warmup_matches_megatron(p, v, m):
    ops = build_schedule(_group("interleaved", pp=p, vpp=v, m=m))
    expected = [min(2 * (p - 1 - r) + (v - 1) * p + 1, m * v) for r in range(p)]
    assert [_forwards_before_first_backward(o) for o in ops] == expected


@pytest.mark.parametrize("p,v,n,m", [(4, 2, 4, 3), (8, 5, 16, 2), (4, 1, 6, 3)])
def test_slimpipe_warmup_is_nv_plus_2_p_minus_1_minus_r(p, v, n, m):
    ops = build_schedule(_group("slimpipe", pp=p, vpp=v, slices=n, m=m))
    expected = [min(n * v + 2 * (p - 1 - r), n * v * m) for r in range(p)]
    assert [_forwards_before_first_backward(o) for o in ops] == expected
    # The first backward is the last slice of the first sequence on the last chunk.
    first_b = ops[0][expected[0]]
    assert first_b == Op("B", 0, v - 1)  # backward unit 0 holds slice n-1 (reverse order)


@pytest.mark.parametrize("kind,v,n", [("gpipe", 1, 1), ("1f1b", 1, 1), ("interleaved", 3, 1),
                                      ("slimpipe", 2, 4), ("slimpipe", 3, 2)])
def test_built_schedules_validate(kind, v, n):
    group = _group(kind, pp=4, vpp=v, slices=n, m=5)
    validate_schedule(group, build_schedule(group))


def test_1f1b_with_virtual_stages_is_rejected():
    group = _group("interleaved", pp=2, vpp=2)
    group = dataclasses.replace(group, schedule="1f1b")
    with pytest.raises(ScheduleError, match="vpp = 1"):
        build_schedule(group)


def test_validate_catches_duplicates_missing_and_order():
    group = _group("1f1b", pp=2, m=2)
    ops = build_schedule(group)
    with pytest.raises(ScheduleError, match="more than once"):
        validate_schedule(group, [ops[0] + [ops[0][0]], ops[1]])
    with pytest.raises(ScheduleError, match="missing"):
        validate_schedule(group, [ops[0][:-1], ops[1]])
    with pytest.raises(ScheduleError, match="before slice"):
        validate_schedule(group, [[Op("B", 0, 0)] + [o for o in ops[0] if o != Op("B", 0, 0)],
                                  ops[1]])


def test_validate_catches_kv_order():
    group = _group("slimpipe", pp=2, slices=2, m=1)  # slices 0 then 1 of one sequence
    bad = [[Op("F", 1, 0), Op("F", 0, 0), Op("B", 0, 0), Op("B", 1, 0)]] * 2
    with pytest.raises(ScheduleError, match="KV cache"):
        validate_schedule(group, bad)


def test_deadlock_names_the_stuck_ops():
    group = _group("1f1b", pp=2, m=2)
    # Stage 0 waits for B0's gradient before it sends F1; stage 1 needs F1 before B0.
    ops = [[Op("F", 0, 0), Op("B", 0, 0), Op("F", 1, 0), Op("B", 1, 0)],
           [Op("F", 0, 0), Op("F", 1, 0), Op("B", 0, 0), Op("B", 1, 0)]]
    message = find_deadlock(group, ops)
    assert message is not None
    assert "stage 0 stuck at op #1 B(unit 0, chunk 0)" in message
    assert "stage 1 stuck at op #1 F(unit 1, chunk 0)" in message
    with pytest.raises(ScheduleError, match="deadlocks"):
        validate_schedule(group, ops)


def _asymmetric_group(lengths: list[int], slice_tokens: int, fwd_cuts: list[int],
                      bwd_cuts: list[int], *, pp: int, vpp: int) -> Group:
    """Sequences cut into slices; forward/backward units cut the slice list at given points.

    Backward units are built over the per-sequence-reversed slice order, so each sequence is
    backwarded last slice first, as Plan.validate requires.
    """
    slices: list[Slice] = []
    runs: list[list[int]] = []
    for seq, n in enumerate(lengths):
        run = []
        for start in range(0, n, slice_tokens):
            slices.append(Slice(slice_id=len(slices), segments=(
                Segment(seq_id=seq, start=start, end=min(n, start + slice_tokens)),)))
            run.append(slices[-1].slice_id)
        runs.append(run)
    fwd_ids = [s.slice_id for s in slices]
    bwd_ids = [sid for run in runs for sid in reversed(run)]

    def cut(ids: list[int], cuts: list[int]) -> tuple[Unit, ...]:
        points = sorted({c % len(ids) for c in cuts if c % len(ids)} | {0, len(ids)})
        return tuple(Unit(slice_ids=tuple(ids[a:b])) for a, b in zip(points, points[1:], strict=False))

    group = Group(group_id=0, ranks=tuple(range(pp)), pp=pp, vpp=vpp, slices=tuple(slices),
                  forward_units=cut(fwd_ids, fwd_cuts), backward_units=cut(bwd_ids, bwd_cuts),
                  schedule="asymmetric")
    group.validate()
    return group


def test_asymmetric_hand_case():
    # One 8-slice sequence: forward units {0,1} {2} {3} {4,5} {6,7}; backward {7} {6,5}
    # {4,3,2} {1,0}: later slices cost more forward, so they travel in smaller packs.
    group = _asymmetric_group([8], 1, [2, 3, 4, 6], [1, 3, 6], pp=4, vpp=1)
    ops = build_schedule(group)
    validate_schedule(group, ops)
    # The last stage's first backward (slice 7) needs every forward unit first: the sequence
    # is backwarded from its end. Rank 0 runs all 5 forward units before it.
    assert ops[3][:6] == [Op("F", u, 0) for u in range(5)] + [Op("B", 0, 0)]
    assert _forwards_before_first_backward(ops[0]) == 5


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=6),
       fwd_cuts=st.lists(st.integers(1, 60), max_size=8),
       bwd_cuts=st.lists(st.integers(1, 60), max_size=8),
       pp=st.integers(1, 4), vpp=st.integers(1, 3))
def test_asymmetric_schedules_are_valid_and_deadlock_free(lengths, fwd_cuts, bwd_cuts, pp, vpp):
    group = _asymmetric_group(lengths, 2, fwd_cuts, bwd_cuts, pp=pp, vpp=vpp)
    validate_schedule(group, build_schedule(group))


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=6),
       fwd_cuts=st.lists(st.integers(1, 60), max_size=10),
       bwd_cuts=st.lists(st.integers(1, 60), max_size=10),
       pp=st.integers(1, 8))
def test_single_chunk_schedules_never_deadlock(lengths, fwd_cuts, bwd_cuts, pp):
    # build_schedule skips its deadlock check when vpp = 1 (proof in pipeline.py): the
    # independent zero-duration run must agree on every random asymmetric partition.
    group = _asymmetric_group(lengths, 2, fwd_cuts, bwd_cuts, pp=pp, vpp=1)
    ops = build_schedule(group)
    assert find_deadlock(group, ops) is None
    validate_schedule(group, ops)


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 4), v=st.integers(2, 4), slices=st.integers(1, 3), m=st.integers(1, 5),
       offsets=st.lists(st.integers(0, 12), min_size=4, max_size=4),
       shuffled=st.lists(st.booleans(), min_size=4, max_size=4), seed=st.integers(0, 2**16))
def test_integer_deadlock_walk_matches_the_op_walk(p, v, slices, m, offsets, shuffled, seed):
    """The repair loop's integer walk (``_OpCodes.progress``) stops every stage at the same
    op as :func:`progress` on the ``Op`` lists: on the rule's orders, and on shuffled stages
    that deadlock (p = 1 puts every input on the same stage)."""
    import numpy as np

    from slimpack.schedules.orders import backward_order, forward_order
    from slimpack.schedules.pipeline import _stage_order, forward_counts
    from slimpack.schedules.validate import progress

    group = _group("slimpipe", pp=p, vpp=v, slices=slices, m=m)
    fwd, bwd = forward_order(group), backward_order(group)
    needs, codes = _needs_and_codes(group)
    rng = np.random.default_rng(seed)
    counts = [forward_counts(needs, offsets[r], len(fwd), False) for r in range(p)]
    orders = [rng.permutation(len(fwd) + len(bwd)) if shuffled[r]
              else _stage_order(len(fwd), counts[r]) for r in range(p)]
    ops = [[(fwd + bwd)[k] for k in order.tolist()] for order in orders]
    for r in range(p):
        if not shuffled[r]:
            assert ops[r] == _interleave_reference(fwd, bwd, counts[r])
    assert codes.progress(orders) == progress(group, ops)


def _needs_and_codes(group: Group):  # noqa: ANN202 - (needs, the builder's _OpCodes)
    """The builder's needs per backward op and its op codes, from the orders as arrays."""
    from slimpack.schedules.orders import backward_order_arrays, forward_order_arrays
    from slimpack.schedules.pipeline import _backward_needs, _OpCodes

    (f_unit, f_chunk), (b_unit, b_chunk) = (forward_order_arrays(group),
                                            backward_order_arrays(group))
    return (_backward_needs(group, f_unit, b_unit),
            _OpCodes(f_unit, f_chunk, b_unit, b_chunk, group.vpp))


def _interleave_reference(fwd, bwd, counts):
    out, done = [], 0
    for op, count in zip(bwd, counts.tolist(), strict=True):
        out.extend(fwd[done:max(done, count)])
        done = max(done, count)
        out.append(op)
    return out + fwd[done:]


def _rounds_group(round_sizes: list[int], *, pp: int, vpp: int) -> Group:
    """SlimPack's layout in miniature: rounds of MicroPacks, one short document each, every
    round backwarded as one block in reverse (its mirrored partition)."""
    slices: list[Slice] = []
    forward: list[Unit] = []
    backward: list[Unit] = []
    for size in round_sizes:
        first = len(slices)
        for _ in range(size):
            slices.append(Slice(slice_id=len(slices),
                                segments=(Segment(seq_id=len(slices), start=0, end=4),)))
        ids = range(first, len(slices))
        forward += [Unit(slice_ids=(i,)) for i in ids]
        backward += [Unit(slice_ids=(i,)) for i in reversed(ids)]
    group = Group(group_id=0, ranks=tuple(range(pp)), pp=pp, vpp=vpp, slices=tuple(slices),
                  forward_units=tuple(forward), backward_units=tuple(backward),
                  schedule="asymmetric")
    group.validate()
    return group


def _rule_runs_without_repair(group: Group) -> bool:
    """Whether the warm-up rule's own orders (no repair) run every op."""
    from slimpack.schedules.orders import forward_order
    from slimpack.schedules.pipeline import _stage_order, forward_counts, warmup_offset

    fwd = forward_order(group)
    needs, codes = _needs_and_codes(group)
    orders = [_stage_order(len(fwd), forward_counts(
                  needs, warmup_offset(group.schedule, group.pp, group.vpp, r), len(fwd), False))
              for r in range(group.pp)]
    pos = codes.progress(orders)
    return all(p == len(o) for p, o in zip(pos, orders, strict=True))


def test_interleaved_groups_keep_a_backward_block_whole():
    # Rounds of 1, 2, 3 and 6 MicroPacks at pp 4: grouping single units four at a time cut
    # the 3- and 6-unit rounds, put the later group's backwards first and deadlocked the
    # rule (the repair then ran ~every forward before any backward). Whole rounds do not.
    from slimpack.schedules.orders import forward_groups

    group = _rounds_group([1, 2, 3, 6], pp=4, vpp=2)
    assert forward_groups(group, 4) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    assert _rule_runs_without_repair(group)
    validate_schedule(group, build_schedule(group))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=6), pp=st.integers(2, 4),
       vpp=st.integers(2, 3))
def test_rounds_never_split_and_the_rule_never_deadlocks(sizes, pp, vpp):
    from slimpack.schedules.orders import forward_groups

    group = _rounds_group(sizes, pp=pp, vpp=vpp)
    bounds = {sum(sizes[:k]) for k in range(len(sizes) + 1)}
    for members in forward_groups(group, pp):
        assert members[0] in bounds and members[-1] + 1 in bounds
    assert _rule_runs_without_repair(group)


def _orders_op_by_op(group: Group) -> tuple[list[Op], list[Op]]:
    """The shared orders as the module docstring reads: forward groups chunk-major; each run
    of backward units owned by one forward group, from the last chunk down."""
    from slimpack.schedules.orders import forward_groups

    v = group.vpp
    if v == 1:
        return ([Op("F", u, 0) for u in range(len(group.forward_units))],
                [Op("B", u, 0) for u in range(len(group.backward_units))])
    groups = forward_groups(group, group.pp)
    fwd = [Op("F", u, c) for members in groups for c in range(v) for u in members]
    owner = {sid: g for g, members in enumerate(groups) for u in members
             for sid in group.forward_units[u].slice_ids}
    owners = [max(owner[sid] for sid in unit.slice_ids) for unit in group.backward_units]
    bwd: list[Op] = []
    start = 0
    while start < len(owners):
        end = start
        while end < len(owners) and owners[end] == owners[start]:
            end += 1
        bwd += [Op("B", u, c) for c in reversed(range(v)) for u in range(start, end)]
        start = end
    return fwd, bwd


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 4), v=st.integers(1, 4), slices=st.integers(1, 3), m=st.integers(1, 6),
       rounds=st.lists(st.integers(1, 7), min_size=1, max_size=5))
def test_orders_as_arrays_are_the_orders_op_by_op(p, v, slices, m, rounds):
    """The builder reads the orders as arrays (no op objects); they are the rule's orders, on
    SlimPipe's sequences of slices and on SlimPack's reversed rounds."""
    from slimpack.schedules.orders import backward_order, forward_order

    for group in (_group("slimpipe", pp=p, vpp=v, slices=slices, m=m),
                  _rounds_group(rounds, pp=p, vpp=v)):
        assert (forward_order(group), backward_order(group)) == _orders_op_by_op(group)
        fwd, bwd = _orders_op_by_op(group)
        for stage_ops in build_schedule(group):
            assert sorted(map(str, stage_ops)) == sorted(map(str, fwd + bwd))
