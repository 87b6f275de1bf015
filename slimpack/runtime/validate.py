"""Everything the runtime checks before a single process starts.

A plan that cannot run (wrong world size, missing slices, a schedule that would deadlock or
mismatch p2p messages, any field the executor does not implement or a tp/cp the model cannot
split: see :mod:`slimpack.runtime.capabilities`) fails here with a ValueError naming the
problem, instead of hanging a job of N processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slimpack.plan import Group, Move, Plan, PlanError
from slimpack.runtime.capabilities import (
    check_group_fields,
    check_model_supported,
    check_plan_fields,
    check_tp_layout,
    check_vocab_layout,
    check_zero_stage,
)
from slimpack.runtime.schedule import SCHEDULE_SOURCE, build_group_schedule
from slimpack.sim.redistribution import check_move_ticks
from slimpack.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class RuntimePlan:
    """A plan checked for the runtime, with what every rank needs to know about it."""

    plan: Plan
    pp: int
    vpp: int
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
    if model.num_layers % (pp * vpp):
        raise ValueError(f"pp*vpp = {pp}*{vpp} must divide num_layers = {model.num_layers} "
                         f"({model.name})")
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
    return RuntimePlan(plan=plan, pp=pp, vpp=vpp, stage_of_rank=stage_of_rank,
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
    want = sorted([("F", u, c) for u in range(len(group.forward_units)) for c in range(vpp)]
                  + [("B", u, c) for u in range(len(group.backward_units)) for c in range(vpp)])
    for s, stage_ops in enumerate(ops):
        got = sorted((op.kind, op.unit, op.chunk) for op in stage_ops)
        if got != want:
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


def _in_order(ids: tuple[int, ...], needs: dict[int, set[int]], done: set[int]) -> bool:
    """Whether each slice of ``ids`` finds what it needs (``needs[i]``) done already or run
    before it in the unit."""
    seen: set[int] = set()
    for i in ids:
        need = needs.get(i)
        if need and any(x not in done and x not in seen for x in need):
            return False
        seen.add(i)
    return True


def _dry_run(group: Group, ops: list[list], *, vocab_over_pp: bool,
             fixed: list[list[tuple[int, int]]] | None = None) -> list[list[tuple[int, int]]]:
    pp, last = group.pp, group.pp * group.vpp - 1
    fwd_slices = [u.slice_ids for u in group.forward_units]
    bwd_slices = [u.slice_ids for u in group.backward_units]
    # Same-sequence order: a slice's forward needs its sequence's earlier slices forwarded,
    # its backward needs the later ones backwarded (the KV cache and dK/dV flow).
    # Built per sequence (its slices by start), not over all pairs of slices: a 33.5M-token
    # plan holds thousands of slices per group, and most sequences sit in one slice.
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
    done_f = [[set() for _ in range(group.vpp)] for _ in range(pp)]
    done_b = [[set() for _ in range(group.vpp)] for _ in range(pp)]
    pos = [0] * pp

    def ready(s: int, op) -> bool:  # noqa: ANN001 - a schedule op
        block = op.chunk * pp + s
        if op.kind == "F":
            # Slices of a unit run in its listed order, so a slice may also follow
            # the unit's slices listed before it.
            if not _in_order(fwd_slices[op.unit], earlier, done_f[s][op.chunk]):
                return False
            return block == 0 or _peek(channels, ((s - 1) % pp, s, "F"), (op.unit, block))
        ids = bwd_slices[op.unit]
        if any(i not in done_f[s][op.chunk] for i in ids):
            return False
        if not _in_order(ids, later, done_b[s][op.chunk]):
            return False
        return block == last or _peek(channels, ((s + 1) % pp, s, "B"), (op.unit, block))

    def run(s: int, op) -> None:  # noqa: ANN001 - a schedule op
        block = op.chunk * pp + s
        if op.kind == "F":
            if block > 0:
                channels[((s - 1) % pp, s, "F")].pop(0)
            done_f[s][op.chunk].update(fwd_slices[op.unit])
            if block < last:
                channels.setdefault((s, (s + 1) % pp, "F"), []).append((op.unit, block + 1))
        else:
            if block < last:
                channels[((s + 1) % pp, s, "B")].pop(0)
            done_b[s][op.chunk].update(bwd_slices[op.unit])
            if block > 0:
                channels.setdefault((s, (s - 1) % pp, "B"), []).append((op.unit, block - 1))

    # Vocabulary-parallel LM head (vocab_over_pp): the last stage runs unit u's head inside
    # its F(u) of the last block, which completes only once every other stage has joined it;
    # a stage that joined waits there until then. Heads complete in the last stage's order.
    # ``fixed``: the other stages join at these (op index, unit) positions; None: they join
    # where they stand once no stage can move and the last stage waits for a head.
    heads_done = 0
    joined = [0] * pp
    taken = [0] * pp  # fixed joins made per stage
    joins: list[list[tuple[int, int]]] = [[] for _ in range(pp)]

    def is_head(s: int, op) -> bool:  # noqa: ANN001 - a schedule op
        return vocab_over_pp and s == pp - 1 and op.kind == "F" and op.chunk == group.vpp - 1

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
                if pos[s] == len(ops[s]):
                    break
                op = ops[s][pos[s]]
                if not ready(s, op):
                    break
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
        # Every stage is blocked. If the last stage waits only for the others to join the
        # head of its next op, each joins where it stands: it was waiting there anyway.
        head = ops[pp - 1][pos[pp - 1]] if pos[pp - 1] < len(ops[pp - 1]) else None
        if fixed is not None or head is None or not is_head(pp - 1, head) or not ready(pp - 1, head):
            break
        for t in range(pp - 1):
            joins[t].append((pos[t], head.unit))
            joined[t] += 1
    stuck = [f"stage {s} at {op.kind}(unit {op.unit}, chunk {op.chunk})"
             for s in range(pp) if pos[s] < len(ops[s]) for op in [ops[s][pos[s]]]]
    heads = [op.unit for op in ops[pp - 1] if is_head(pp - 1, op)]
    stuck += [f"stage {s} waiting there in the LM head of forward unit {heads[heads_done]}"
              for s in range(pp - 1) if joined[s] > heads_done]
    if stuck:
        raise PlanError(f"group {group.group_id}: the schedule deadlocks or receives messages "
                        f"out of order ({', '.join(stuck)})")
    return joins


def _peek(channels: dict, key: tuple[int, int, str], msg: tuple[int, int]) -> bool:
    """Whether ``msg`` is the oldest message on the channel (FIFO, as NCCL matches)."""
    queue = channels.get(key)
    return bool(queue) and queue[0] == msg
