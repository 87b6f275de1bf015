"""The timing walk's inner loop, compiled (numba): list scheduling over flat op arrays.

:func:`slimpack.sim.engine.run_group` owns the semantics (its module docstring) and prepares
the arrays; this module only runs the loop. It is the hottest loop of every search (a
paper-scale plan walks ~10^6 ops per candidate), and a max-plus recurrence over ~10^5
dependent levels does not vectorise, so it is compiled rather than written in numpy. Every
float operation is the one the walk written in Python does, in the same order (``+`` and
comparisons on float64), so the times are the same to the last bit: ``tests/test_compiled_walks``
checks that against the walk written op by op.

The work list is the same last-in-first-out stack, so the order in which ops are visited
(``visit_order``, what a trace lists) is the order of the walk written in Python.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def walk(stage_first: np.ndarray, is_fwd: np.ndarray, unit: np.ndarray, chunk: np.ndarray,
         fwd_s: np.ndarray, bwd_s: np.ndarray, fwd_send_s: np.ndarray, bwd_send_s: np.ndarray,
         start_s: np.ndarray, blocking: bool):  # noqa: ANN201 (a tuple of arrays)
    """List scheduling of ``pp`` stages' op lists, flat: stage ``s``'s ops are
    ``stage_first[s]:stage_first[s+1]`` of ``is_fwd``/``unit``/``chunk``.

    ``fwd_s``/``bwd_s`` [virtual stage, unit] are op seconds, ``fwd_send_s``/``bwd_send_s``
    [stage, unit] the p2p of an op's output, ``start_s`` [stage] when each lane is free.
    Returns (per stage: lane free at the end, last backward's start, busy seconds, ops run;
    per flat op: start, end, send start, send arrival (NaN: no send); the flat op indices in
    the order the walk visited them)."""
    pp = len(start_s)
    num_vs = fwd_s.shape[0]
    last_vs = num_vs - 1
    nf = fwd_s.shape[1]
    nb = bwd_s.shape[1]
    b_base = num_vs * nf
    size = b_base + num_vs * nb
    arrival = np.zeros(size, dtype=np.float64)
    arrived = np.zeros(size, dtype=np.bool_)
    waiting = np.full(size, -1, dtype=np.int64)
    total = len(is_fwd)
    op_start = np.empty(total, dtype=np.float64)
    op_end = np.empty(total, dtype=np.float64)
    send_start = np.full(total, np.nan, dtype=np.float64)
    send_end = np.full(total, np.nan, dtype=np.float64)
    visit_order = np.empty(total, dtype=np.int64)
    visited = 0
    pos = stage_first[:pp].copy()
    lane_free = start_s.copy()
    send_next_free = start_s.copy()
    send_prev_free = start_s.copy()
    busy = np.zeros(pp, dtype=np.float64)
    last_b_start = np.zeros(pp, dtype=np.float64)
    blocks = blocking and pp > 1
    work = np.empty(pp + size, dtype=np.int64)
    top = 0
    for s in range(pp - 1, -1, -1):
        work[top] = s
        top += 1
    while top > 0:
        top -= 1
        s = work[top]
        i = pos[s]
        n = stage_first[s + 1]
        free = lane_free[s]
        while i < n:
            u = unit[i]
            c = chunk[i]
            vs = c * pp + s
            if is_fwd[i]:
                if vs > 0:
                    need = (vs - 1) * nf + u
                    if not arrived[need]:
                        waiting[need] = s
                        break
                    ready = arrival[need]
                    start = ready if ready > free else free
                else:
                    start = free
                end = start + fwd_s[vs, u]
                lane_end = end
                if vs < last_vs:
                    key = vs * nf + u
                    if pp > 1:
                        t0 = end if end > send_next_free[s] else send_next_free[s]
                        arrive = t0 + fwd_send_s[s, u]
                        send_next_free[s] = arrive
                        if blocks:
                            lane_end = arrive
                        send_start[i] = t0
                        send_end[i] = arrive
                    else:
                        arrive = end
                    arrival[key] = arrive
                    arrived[key] = True
                    waiter = waiting[key]
                    if waiter >= 0:
                        work[top] = waiter
                        top += 1
            else:
                if vs < last_vs:
                    need = b_base + (vs + 1) * nb + u
                    if not arrived[need]:
                        waiting[need] = s
                        break
                    ready = arrival[need]
                    start = ready if ready > free else free
                else:
                    start = free
                end = start + bwd_s[vs, u]
                lane_end = end
                last_b_start[s] = start
                if vs > 0:
                    key = b_base + vs * nb + u
                    if pp > 1:
                        t0 = end if end > send_prev_free[s] else send_prev_free[s]
                        arrive = t0 + bwd_send_s[s, u]
                        send_prev_free[s] = arrive
                        if blocks:
                            lane_end = arrive
                        send_start[i] = t0
                        send_end[i] = arrive
                    else:
                        arrive = end
                    arrival[key] = arrive
                    arrived[key] = True
                    waiter = waiting[key]
                    if waiter >= 0:
                        work[top] = waiter
                        top += 1
            busy[s] += end - start
            op_start[i] = start
            op_end[i] = end
            visit_order[visited] = i
            visited += 1
            free = lane_end  # blocking p2p: the lane is held until the send arrives
            i += 1
        pos[s] = i
        lane_free[s] = free
    ran = pos - stage_first[:pp]
    return (lane_free, last_b_start, busy, ran, op_start, op_end, send_start, send_end,
            visit_order[:visited])
