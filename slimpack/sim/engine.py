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
empties with ops left, the op lists deadlock and the error names each stage's stuck op. The
loop runs compiled over flat op arrays (:mod:`slimpack.sim.timing_walk`); this module prepares
them and reads the results back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from slimpack.records import OpTiming
from slimpack.schedules import Op, describe_stuck
from slimpack.schedules.ops import describe_op_ranges, op_arrays, ops_in_range
from slimpack.sim.costs import GroupCosts
from slimpack.sim.memory import GroupMemory, op_list_peaks
from slimpack.sim.timing_walk import walk


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
    layers = costs.layers
    # Each op as (is forward, unit, chunk), read off the ops once for the loop and the walk.
    arrays = [op_arrays(stage_ops) for stage_ops in ops]
    stage_first = np.zeros(pp + 1, dtype=np.int64)
    stage_first[1:] = np.cumsum([len(stage_ops) for stage_ops in ops])
    is_fwd, unit, chunk = (np.concatenate([a[k] for a in arrays]) for k in range(3))
    fwd_s = _table(costs.fwd_s, num_vs)
    bwd_s = _table(costs.bwd_s, num_vs)
    fwd_send = _table(costs.fwd_send_s, pp, width=fwd_s.shape[1])
    bwd_send = _table(costs.bwd_send_s, pp, width=bwd_s.shape[1])
    _check_in_range(is_fwd, unit, chunk, pp=pp, num_vs=num_vs, nf=fwd_s.shape[1],
                    nb=bwd_s.shape[1])
    (lane_free, last_b_start, busy, ran, op_start, op_end, send_start, send_end,
     visit_order) = walk(stage_first, is_fwd, unit, chunk, fwd_s, bwd_s, fwd_send, bwd_send,
                         np.asarray(start_s, dtype=np.float64), costs.blocking_sends)
    if any(int(ran[s]) < len(ops[s]) for s in range(pp)):
        raise DeadlockError(f"Group {group_id}: simulation deadlocked; "
                            f"{describe_stuck(ops, ran.tolist(), pp)}")
    timings = _timings(group_id, stage_first, visit_order, is_fwd, unit, chunk, op_start, op_end,
                       send_start, send_end) if record else []
    # Memory changes only at a stage's own ops, in its op-list order: the order-only walk
    # (offload copies to host as F ends and fetches back before B runs) gives the peaks.
    peak_mem, peak_act = op_list_peaks(ops, memory, layers, arrays=arrays)
    ideal = 0.0
    for vs in range(num_vs):
        ideal += sum(costs.fwd_ideal_s[vs]) + sum(costs.bwd_ideal_s[vs])
    total_ops = sum(len(x) for x in ops)
    comm_ops = 0 if pp == 1 else (num_vs - 1) * (fwd_s.shape[1] + bwd_s.shape[1])
    return GroupTimeline(compute_end=lane_free.tolist(),
                         last_backward_start=last_b_start.tolist(), busy_s=busy.tolist(),
                         ideal_s=ideal, peak_activation=peak_act, peak_dynamic=peak_mem,
                         num_ops=total_ops + comm_ops, ops=timings)


def _check_in_range(is_fwd: np.ndarray, unit: np.ndarray, chunk: np.ndarray, *, pp: int,
                    num_vs: int, nf: int, nb: int) -> None:
    """The compiled walk indexes its tables by unit and virtual stage without bounds checks:
    every op must name a priced unit on a virtual stage of the group."""
    vpp = num_vs // max(pp, 1)
    if not ops_in_range(is_fwd, unit, chunk, num_forward=nf, num_backward=nb, vpp=vpp):
        raise ValueError("run_group: " + describe_op_ranges(unit, chunk, num_forward=nf,
                                                            num_backward=nb, vpp=vpp))


def _table(rows: list[list[float]], count: int, *, width: int | None = None) -> np.ndarray:
    """``rows`` (``count`` rows of one length) as a float64 array; no rows (a single stage
    sends nothing): zeros of ``width`` columns."""
    if not rows:
        return np.zeros((count, width or 0), dtype=np.float64)
    table = np.asarray(rows, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] != count:
        raise ValueError(f"cost table must be {count} equal rows, got shape {table.shape}")
    return table


def _timings(group_id: int, stage_first: np.ndarray, visit_order: np.ndarray, is_fwd: np.ndarray,
             unit: np.ndarray, chunk: np.ndarray, op_start: np.ndarray, op_end: np.ndarray,
             send_start: np.ndarray, send_end: np.ndarray) -> list[OpTiming]:
    """The trace: each op in the order the walk visited it, its send (if any) first."""
    stage_of = np.repeat(np.arange(len(stage_first) - 1), np.diff(stage_first))
    timings: list[OpTiming] = []
    for i in visit_order.tolist():
        s, u, c, fwd = int(stage_of[i]), int(unit[i]), int(chunk[i]), bool(is_fwd[i])
        if not np.isnan(send_start[i]):
            timings.append(OpTiming(stage=s, kind="send-F" if fwd else "send-B", unit=u, chunk=c,
                                    start_s=float(send_start[i]), end_s=float(send_end[i]),
                                    lane="send-next" if fwd else "send-prev", group=group_id))
        timings.append(OpTiming(stage=s, kind="F" if fwd else "B", unit=u, chunk=c,
                                start_s=float(op_start[i]), end_s=float(op_end[i]),
                                group=group_id))
    return timings
