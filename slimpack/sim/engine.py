"""The timing walk: list scheduling of one group's op lists with per-unit durations.

Each stage has one compute lane that runs its op list in order, and two send lanes (towards
the next and the previous stage) so activation and gradient transfers overlap compute. An op
starts when its lane is free and its input has arrived: F on virtual stage ``vs`` needs the
activation F produced on ``vs - 1``, B needs the gradient B produced on ``vs + 1``. Same-stage
edges (KV-cache order, reverse-order backward, B after the last stage's F) are list order,
checked by :func:`slimpack.schedules.validate_schedule` for custom lists and guaranteed by
:func:`slimpack.schedules.build_schedule`.

With ``GroupCosts.blocking_sends`` (Megatron-LM 2021-22's p2p on the compute stream) a stage's
compute lane is held until each of its sends arrives; the op's own busy time is unchanged.

Sends leave a lane in the order its stage produces them, so a lane is a single "free at"
time, not a queue. A stage that waits for a missing input parks on that input's key and is
woken when it is produced: every op is visited once, O(ops), no heap needed. If the work list
empties with ops left, the op lists deadlock and the error names each stage's stuck op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slimpack.records import OpTiming
from slimpack.schedules import Op, describe_stuck
from slimpack.sim.costs import GroupCosts
from slimpack.sim.memory import GroupMemory, op_arrays, op_list_peaks


class DeadlockError(RuntimeError):
    """The op lists cannot all complete; the message names the stuck op of each stage."""


@dataclass(kw_only=True, slots=True)
class GroupTimeline:
    """What the walk measured for one group (times in seconds from the step start)."""

    compute_end: list[float]
    """Per stage: when its last op ends."""
    last_backward_start: list[float]
    busy_s: list[float]
    """Per stage: seconds its compute lane was busy."""
    ideal_s: float
    """Balanced compute seconds summed over the group's stages (one device's view)."""
    peak_activation: list[float]
    """Per stage: peak of activations alone (bytes per device)."""
    peak_dynamic: list[float]
    """Per stage: peak of activations plus dK/dV buffers."""
    num_ops: int = 0
    ops: list[OpTiming] = field(default_factory=list)


def run_group(*, group_id: int, ops: list[list[Op]], costs: GroupCosts, memory: GroupMemory,
              start_s: list[float], record: bool) -> GroupTimeline:
    pp = len(ops)
    num_vs = len(costs.layers)
    last_vs = num_vs - 1
    nf = len(costs.fwd_s[0])
    nb = len(costs.bwd_s[0])
    # Arrival time of each op's input, flat-indexed: F at vs*nf + u, B at b_base + vs*nb + u.
    b_base = num_vs * nf
    arrival: list[float | None] = [None] * (b_base + num_vs * nb)
    # The stage waiting on each input (-1: none): every input arrives once, so a list
    # indexed like ``arrival`` replaces a dict's pops.
    waiting = [-1] * len(arrival)
    pos = [0] * pp
    lane_free = list(start_s)
    send_next_free = list(start_s)
    send_prev_free = list(start_s)
    busy = [0.0] * pp
    last_b_start = [0.0] * pp
    layers = costs.layers
    fwd_s, bwd_s = costs.fwd_s, costs.bwd_s
    fwd_send, bwd_send = costs.fwd_send_s, costs.bwd_send_s
    blocking = costs.blocking_sends and pp > 1
    timings: list[OpTiming] = []
    # Each op as (is forward, unit, chunk), read off the ops once for the loop and the walk.
    arrays = [op_arrays(stage_ops) for stage_ops in ops]
    plain = [list(zip(*(a.tolist() for a in stage), strict=True)) for stage in arrays]
    work = list(range(pp - 1, -1, -1))
    while work:
        s = work.pop()
        stage_ops = plain[s]
        i = pos[s]
        n = len(stage_ops)
        free = lane_free[s]
        while i < n:
            is_f, u, c = stage_ops[i]
            vs = c * pp + s
            if is_f:
                if vs:
                    ready = arrival[(vs - 1) * nf + u]
                    if ready is None:
                        waiting[(vs - 1) * nf + u] = s
                        break
                    start = ready if ready > free else free
                else:
                    start = free
                end = lane_end = start + fwd_s[vs][u]
                if vs < last_vs:
                    key = vs * nf + u
                    if pp > 1:
                        t0 = end if end > send_next_free[s] else send_next_free[s]
                        arrive = t0 + fwd_send[s][u]
                        send_next_free[s] = arrive
                        if blocking:
                            lane_end = arrive
                        if record:
                            timings.append(OpTiming(stage=s, kind="send-F", unit=u, chunk=c,
                                                    start_s=t0, end_s=arrive, lane="send-next",
                                                    group=group_id))
                    else:
                        arrive = end
                    arrival[key] = arrive
                    waiter = waiting[key]
                    if waiter >= 0:
                        work.append(waiter)
            else:
                if vs < last_vs:
                    ready = arrival[b_base + (vs + 1) * nb + u]
                    if ready is None:
                        waiting[b_base + (vs + 1) * nb + u] = s
                        break
                    start = ready if ready > free else free
                else:
                    start = free
                end = lane_end = start + bwd_s[vs][u]
                last_b_start[s] = start
                if vs > 0:
                    key = b_base + vs * nb + u
                    if pp > 1:
                        t0 = end if end > send_prev_free[s] else send_prev_free[s]
                        arrive = t0 + bwd_send[s][u]
                        send_prev_free[s] = arrive
                        if blocking:
                            lane_end = arrive
                        if record:
                            timings.append(OpTiming(stage=s, kind="send-B", unit=u, chunk=c,
                                                    start_s=t0, end_s=arrive, lane="send-prev",
                                                    group=group_id))
                    else:
                        arrive = end
                    arrival[key] = arrive
                    waiter = waiting[key]
                    if waiter >= 0:
                        work.append(waiter)
            busy[s] += end - start
            if record:
                timings.append(OpTiming(stage=s, kind="F" if is_f else "B", unit=u, chunk=c,
                                        start_s=start, end_s=end, group=group_id))
            free = lane_end  # blocking p2p: the lane is held until the send arrives
            i += 1
        pos[s] = i
        lane_free[s] = free
    if any(pos[s] < len(ops[s]) for s in range(pp)):
        raise DeadlockError(f"Group {group_id}: simulation deadlocked; "
                            f"{describe_stuck(ops, pos, pp)}")
    # Memory changes only at a stage's own ops, in its op-list order: the order-only walk
    # (offload copies to host as F ends and fetches back before B runs) gives the peaks.
    peak_mem, peak_act = op_list_peaks(ops, memory, layers, arrays=arrays)
    ideal = 0.0
    for vs in range(num_vs):
        ideal += sum(costs.fwd_ideal_s[vs]) + sum(costs.bwd_ideal_s[vs])
    total_ops = sum(len(x) for x in ops)
    comm_ops = 0 if pp == 1 else (num_vs - 1) * (nf + nb)
    return GroupTimeline(compute_end=lane_free, last_backward_start=last_b_start, busy_s=busy,
                         ideal_s=ideal, peak_activation=peak_act, peak_dynamic=peak_mem,
                         num_ops=total_ops + comm_ops, ops=timings)
