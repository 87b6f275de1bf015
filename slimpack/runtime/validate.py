"""Everything the runtime checks before a single process starts.

A plan that cannot run (wrong world size, missing slices, a schedule that would deadlock or
mismatch p2p messages, any field the executor does not implement or a tp/cp the model cannot
split: see :mod:`slimpack.runtime.capabilities`) fails here with a ValueError naming the
problem, instead of hanging a job of N processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from slimpack.plan import Group, Move, Plan, PlanError
from slimpack.runtime.capabilities import (
    check_group_fields,
    check_model_supported,
    check_plan_fields,
    check_tp_layout,
    check_vocab_layout,
    check_zero_stage,
)
from slimpack.runtime.dry_run_walk import dry_run
from slimpack.runtime.schedule import SCHEDULE_SOURCE, build_group_schedule
from slimpack.schedules.ops import describe_op_ranges, op_arrays, ops_in_range
from slimpack.sim.redistribution import check_move_ticks
from slimpack.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class RuntimePlan:
    """A plan checked for the runtime, with what every rank needs to know about it."""

    plan: Plan
    pp: int
    vpp: int
    block_layers: tuple[int, ...] | None
    """Each block's (virtual stage's) layers where the plan splits them unevenly."""
    stage_of_rank: dict[int, int]
    """Pipeline stage of every rank that appears in some group (same in every phase)."""
    tp_index_of_rank: dict[int, int]
    """Index of every rank among its tensor-parallel peers: which weight shard it holds
    (same in every phase; its cp position may change, e.g. under DP-Merge)."""
    tp: int
    schedules: dict[int, list[list]]
    """group_id -> op lists per stage."""
    schedule_source: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    head_joins: dict[int, list[list[tuple[int, int]]]] = field(default_factory=dict)
    """group_id -> per stage, (op index, forward unit): where a stage that is not the last one
    joins the vocabulary-parallel LM head of that unit (before that op; index len(ops): after
    the last), empty unless :attr:`vocab_over_pp` (:mod:`slimpack.runtime.vocab_parallel`)."""
    moves: dict[int, tuple[Move, ...]] = field(default_factory=dict)
    """group_id -> SlimPipe's attention redistribution moves (the plan's
    ``Group.attention_moves``), for groups with any; executed by
    :mod:`slimpack.runtime.redistribution`."""

    @property
    def num_blocks(self) -> int:
        return self.pp * self.vpp

    @property
    def vocab_over_pp(self) -> bool:
        """The LM head is split over the pipeline ranks (capabilities: all groups agree)."""
        return self.pp > 1 and any(g.vocab_parallel_pp for g in self.plan.groups())


def runtime_refusal(plan: Plan, model: ModelSpec) -> str:
    """Why :func:`check_runtime_plan` refuses ``plan`` (its message: the field, its value and
    what is allowed), or "" when the runtime executes it. Records carry it, so every ratio
    says whether the plan behind it runs."""
    try:
        check_runtime_plan(plan, model)
    except ValueError as exc:
        return str(exc)
    return ""


def refused_field(refusal: str) -> str:
    """The plan field a :func:`runtime_refusal` message names ("group 0: vocab_parallel_pp=True
    ..." -> "vocab_parallel_pp"); the message's start when it names none."""
    match = re.search(r"(\w+)=", refusal)
    return match.group(1) if match else refusal.split(";")[0][:60]


def check_runtime_plan(plan: Plan, model: ModelSpec, *, world_size: int | None = None
                       ) -> RuntimePlan:
    """Validate ``plan`` for execution on ``world_size`` processes; raise ValueError.
    With ``attention_redistribution`` at pp > 1 the runtime executes each group's
    ``attention_moves`` as the plan states them (chosen at plan time under the planner's cost
    model); a group without them (a plan older than slimpack-plan/4) is refused."""
    plan.validate()
    if world_size is not None and plan.world_size != world_size:
        raise ValueError(
            f"plan is for {plan.world_size} processes ({plan.parallel.describe()}) but "
            f"{world_size} are available; run it with --nproc {plan.world_size} "
            f"(or torchrun --nproc-per-node {plan.world_size})")
    check_model_supported(model)
    check_plan_fields(plan)
    check_zero_stage(plan, model)
    groups = list(plan.groups())
    pps = {g.pp for g in groups}
    vpps = {g.vpp for g in groups}
    if len(pps) != 1 or len(vpps) != 1:
        raise ValueError(f"the runtime needs one pp and vpp for all groups (a rank keeps its "
                         f"layers for the whole step); plan has pp {sorted(pps)}, vpp {sorted(vpps)}")
    pp, vpp = pps.pop(), vpps.pop()
    block_layers = groups[0].virtual_stage_layers  # Plan.validate: every group the same
    if block_layers is None and model.num_layers % (pp * vpp):
        raise ValueError(f"pp*vpp = {pp}*{vpp} must divide num_layers = {model.num_layers} "
                         f"({model.name})")
    if block_layers is not None and sum(block_layers) != model.num_layers:
        raise ValueError(f"virtual_stage_layers {list(block_layers)} add up to "
                         f"{sum(block_layers)} layers; {model.name} has {model.num_layers}")
    check_tp_layout(groups)
    check_vocab_layout(groups)
    stage_of_rank: dict[int, int] = {}
    tp_index_of_rank: dict[int, int] = {}
    schedules: dict[int, list[list]] = {}
    head_joins: dict[int, list[list[tuple[int, int]]]] = {}
    moves: dict[int, tuple[Move, ...]] = {}
    notes = []
    for g in groups:
        check_group_fields(g, model)
        for i, rank in enumerate(g.ranks):
            stage = i // (g.tp * g.cp)  # ranks ordered (pp, cp, tp), tp fastest
            prev = stage_of_rank.setdefault(rank, stage)
            if prev != stage:
                raise ValueError(f"rank {rank} is pipeline stage {prev} in one group and {stage} "
                                 f"in group {g.group_id}; the runtime keeps a rank's layers "
                                 f"fixed for the step")
            # check_tp_layout: the same tp peers in every group, so the same index.
            tp_index_of_rank[rank] = i % g.tp
        ops = build_group_schedule(g)
        joins = check_schedule(g, ops)
        schedules[g.group_id] = ops
        if g.vocab_parallel_pp and g.pp > 1:
            head_joins[g.group_id] = joins
        if plan.attention_redistribution and g.pp > 1:
            if g.attention_moves is None:
                raise ValueError(
                    f"group {g.group_id}: attention_moves=None with attention_redistribution "
                    f"at pp={g.pp}: the plan does not say which ops exchange attention (a plan "
                    f"older than slimpack-plan/4); re-plan it to have its moves chosen")
            check_move_ticks(g, ops, g.attention_moves)
            if g.attention_moves:
                moves[g.group_id] = g.attention_moves
    return RuntimePlan(plan=plan, pp=pp, vpp=vpp, block_layers=block_layers,
                       stage_of_rank=stage_of_rank,
                       tp_index_of_rank=tp_index_of_rank, tp=groups[0].tp,
                       schedules=schedules, schedule_source=SCHEDULE_SOURCE,
                       notes=tuple(notes), head_joins=head_joins, moves=moves)


def check_schedule(group: Group, ops: list[list]) -> list[list[tuple[int, int]]]:
    """Every stage runs each (F, unit, chunk) and (B, unit, chunk) once, and the op lists run
    to completion with buffered sends, blocking receives and FIFO channels (dry run).

    With ``vocab_parallel_pp`` at pp > 1 it also places every stage's joins of the LM head,
    returned per stage as (op index, forward unit): right after the stage's own forward of the
    unit on its last chunk when those positions run to completion, else where the dry run finds
    every stage blocked (:mod:`slimpack.runtime.vocab_parallel`: why either cannot deadlock)."""
    gid, pp, vpp = group.group_id, group.pp, group.vpp
    if len(ops) != pp:
        raise PlanError(f"group {gid}: schedule has {len(ops)} stages, group has pp={pp}")
    num_f, num_b = len(group.forward_units), len(group.backward_units)
    for s, stage_ops in enumerate(ops):
        is_forward, unit, chunk = op_arrays(stage_ops)
        # Each (kind, unit, chunk) the group has, as one index: F ones first, then B ones.
        index = np.where(is_forward, 0, num_f * vpp) + unit * vpp + chunk
        in_range = ops_in_range(is_forward, unit, chunk, num_forward=num_f,
                                num_backward=num_b, vpp=vpp)
        if len(unit) != (num_f + num_b) * vpp or not in_range or (
                np.bincount(index, minlength=(num_f + num_b) * vpp) != 1).any():
            raise PlanError(f"group {gid}: stage {s} schedule does not run every unit's F and B "
                            f"exactly once per chunk")
    if not (group.vocab_parallel_pp and pp > 1):
        _dry_run(group, ops, vocab_over_pp=False)
        return []
    eager = _eager_joins(group, ops)
    if eager is not None:
        try:
            return _dry_run(group, ops, vocab_over_pp=True, fixed=eager)
        except PlanError:
            pass  # these positions would deadlock: place the joins where stages block
    return _dry_run(group, ops, vocab_over_pp=True)


def _eager_joins(group: Group, ops: list[list]) -> list[list[tuple[int, int]]] | None:
    """Each stage before the last joins unit u's head right after its own F(u) on its last
    chunk (where the simulator charges its share of the head), in the last stage's order of
    heads; None if that order does not follow the stage's op list."""
    pp, chunk = group.pp, group.vpp - 1
    heads = [op.unit for op in ops[pp - 1] if op.kind == "F" and op.chunk == chunk]
    joins: list[list[tuple[int, int]]] = []
    for s in range(pp - 1):
        after = {op.unit: i + 1 for i, op in enumerate(ops[s])
                 if op.kind == "F" and op.chunk == chunk}
        positions = [after[u] for u in heads]
        if positions != sorted(positions):
            return None
        joins.append(list(zip(positions, heads, strict=True)))
    return [*joins, []]


def _dry_run(group: Group, ops: list[list], *, vocab_over_pp: bool,
             fixed: list[list[tuple[int, int]]] | None = None) -> list[list[tuple[int, int]]]:
    """Run the stages' op lists (:func:`dry_run_state`); return each stage's joins of the LM
    head, or raise PlanError naming where the stages stop."""
    pos, joined, heads_done, joins = dry_run_state(group, ops, vocab_over_pp=vocab_over_pp,
                                                   fixed=fixed)
    pp, vpp = group.pp, group.vpp
    stuck = [f"stage {s} at {op.kind}(unit {op.unit}, chunk {op.chunk})"
             for s in range(pp) if pos[s] < len(ops[s]) for op in [ops[s][pos[s]]]]
    heads = [op.unit for op in ops[pp - 1] if op.kind == "F" and op.chunk == vpp - 1]
    stuck += [f"stage {s} waiting there in the LM head of forward unit {heads[heads_done]}"
              for s in range(pp - 1) if joined[s] > heads_done]
    if stuck:
        raise PlanError(f"group {group.group_id}: the schedule deadlocks or receives messages "
                        f"out of order ({', '.join(stuck)})")
    return joins


def dry_run_state(group: Group, ops: list[list], *, vocab_over_pp: bool,
                  fixed: list[list[tuple[int, int]]] | None = None,
                  ) -> tuple[list[int], list[int], int, list[list[tuple[int, int]]]]:
    """Where the dry run of ``ops`` stops (:mod:`slimpack.runtime.dry_run_walk`: the rules
    and the compiled walk): (ops each stage ran, heads each stage joined or ran, heads
    completed, each stage's joins as (op index, forward unit)).

    Vocabulary-parallel LM head (``vocab_over_pp``): the last stage runs unit u's head inside
    its F(u) of the last block, which completes only once every other stage has joined it; a
    stage that joined waits there until then. Heads complete in the last stage's order.
    ``fixed``: the other stages join at these (op index, unit) positions; None: they join
    where they stand once no stage can move and the last stage waits for a head."""
    pp, vpp = group.pp, group.vpp
    if len(ops) != pp:
        raise PlanError(f"group {group.group_id}: schedule has {len(ops)} stages, group has "
                        f"pp={pp}")
    arrays = [op_arrays(stage_ops) for stage_ops in ops]
    is_forward, unit, chunk = (np.concatenate([a[k] for a in arrays]) for k in range(3))
    _check_op_ranges(group, is_forward, unit, chunk)
    dense = _dense_slice_ids(group)
    forward_first, forward_ids = _unit_csr(group.forward_units, dense)
    backward_first, backward_ids = _unit_csr(group.backward_units, dense)
    (earlier_first, earlier_ids), (later_first, later_ids) = _sequence_order_csr(group, dense)
    fixed_lists = list(fixed[:pp]) if fixed is not None else []
    fixed_first = np.zeros(pp + 1, dtype=np.int64)
    fixed_first[1:len(fixed_lists) + 1] = np.cumsum([len(f) for f in fixed_lists])
    fixed_first[len(fixed_lists) + 1:] = fixed_first[len(fixed_lists)]
    flat_fixed = [join for f in fixed_lists for join in f]
    ran, joined, heads_done, join_count, join_position, join_unit = dry_run(
        np.concatenate([[0], np.cumsum([len(a[0]) for a in arrays])]).astype(np.int64),
        is_forward, unit, chunk, forward_first, forward_ids, backward_first,
        backward_ids, earlier_first, earlier_ids, later_first, later_ids, len(dense), vpp,
        vocab_over_pp, fixed is not None, fixed_first,
        np.array([p for p, _ in flat_fixed], dtype=np.int64),
        np.array([u for _, u in flat_fixed], dtype=np.int64))
    joins = [list(zip(join_position[s, :join_count[s]].tolist(),
                      join_unit[s, :join_count[s]].tolist(), strict=True)) for s in range(pp)]
    return ran.tolist(), joined.tolist(), int(heads_done), joins


def _check_op_ranges(group: Group, is_forward: np.ndarray, unit: np.ndarray,
                     chunk: np.ndarray) -> None:
    """The compiled walk indexes by unit and chunk without bounds checks: every op must name
    a unit of the group and one of its chunks."""
    counts = {"num_forward": len(group.forward_units),
              "num_backward": len(group.backward_units), "vpp": group.vpp}
    if not ops_in_range(is_forward, unit, chunk, **counts):
        raise PlanError(f"group {group.group_id}: schedule "
                        + describe_op_ranges(unit, chunk, **counts))


def _dense_slice_ids(group: Group) -> dict[int, int]:
    """Slice id -> index ``0..n-1`` over the group's slices and every id a unit lists."""
    dense: dict[int, int] = {}
    for sl in group.slices:
        dense.setdefault(sl.slice_id, len(dense))
    for units in (group.forward_units, group.backward_units):
        for unit in units:
            for sid in unit.slice_ids:
                dense.setdefault(sid, len(dense))
    return dense


def _unit_csr(units: tuple, dense: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Each unit's slices (dense ids) as (first, ids): unit u's are ``ids[first[u]:first[u+1]]``."""
    sizes = [len(u.slice_ids) for u in units]
    first = np.zeros(len(units) + 1, dtype=np.int64)
    first[1:] = np.cumsum(sizes)
    ids = np.fromiter((dense[sid] for u in units for sid in u.slice_ids), dtype=np.int64,
                      count=int(first[-1]))
    return first, ids


def _sequence_order_csr(group: Group, dense: dict[int, int],
                        ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Same-sequence order, per slice as (first, ids): the slices its forward needs forwarded
    (the same sequence's earlier ones) and those its backward needs backwarded (the later
    ones): the KV cache and dK/dV flow. Built per sequence (its slices by start), not over all
    pairs of slices: a 33.5M-token plan holds thousands of slices per group, and most
    sequences sit in one slice."""
    pieces: dict[int, list[tuple[int, int]]] = {}
    for sl in group.slices:
        for seg in sl.segments:
            pieces.setdefault(seg.seq_id, []).append((seg.start, dense[sl.slice_id]))
    earlier: list[set[int]] = [set() for _ in dense]
    later: list[set[int]] = [set() for _ in dense]
    for of_seq in pieces.values():
        if len(of_seq) < 2:
            continue
        for start_a, a in of_seq:
            for start_b, b in of_seq:
                if start_b < start_a and a != b:
                    earlier[a].add(b)
                    later[b].add(a)

    def csr(sets: list[set[int]]) -> tuple[np.ndarray, np.ndarray]:
        first = np.zeros(len(sets) + 1, dtype=np.int64)
        first[1:] = np.cumsum([len(x) for x in sets])
        return first, np.fromiter((y for x in sets for y in sorted(x)), dtype=np.int64,
                                  count=int(first[-1]))

    return csr(earlier), csr(later)
