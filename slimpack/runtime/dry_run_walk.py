"""The runtime's dry run of a group's schedule, compiled (numba): ops on flat arrays.

:func:`slimpack.runtime.validate.check_schedule` owns the semantics and hands its ops here as
integer arrays: each stage runs its list in order with buffered sends, blocking receives and
FIFO channels; a forward waits for the same sequence's earlier slices, a backward for its own
slices' forwards and the later slices' backwards; with the LM head over the pipeline ranks
(``vocab_over_pp``) the last stage's head of a unit completes only once every other stage has
joined it. Every record's plan is dry-run once (``runtime_refusal``), and a paper-scale plan
holds ~10^6 ops per group, a walk over dependent ops that does not vectorise, so it is compiled
rather than written in numpy (integer and boolean operations only: the same stops, positions
and joins as the walk written in Python, checked in ``tests/test_runtime_dry_run.py``).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def dry_run(stage_first: np.ndarray, is_forward: np.ndarray, unit: np.ndarray,
            chunk: np.ndarray, forward_first: np.ndarray, forward_ids: np.ndarray,
            backward_first: np.ndarray, backward_ids: np.ndarray, earlier_first: np.ndarray,
            earlier_ids: np.ndarray, later_first: np.ndarray, later_ids: np.ndarray,
            num_slices: int, vpp: int, vocab_over_pp: bool, has_fixed: bool,
            fixed_first: np.ndarray, fixed_position: np.ndarray, fixed_unit: np.ndarray,
            ):  # noqa: ANN201
    """Stage ``s`` runs ops ``stage_first[s]:stage_first[s+1]``. Unit ``u``'s slices (dense
    indices ``< num_slices``) are ``forward_ids[forward_first[u]:forward_first[u+1]]``
    (backward alike); slice ``i`` needs ``earlier_ids[earlier_first[i]:earlier_first[i+1]]``
    forwarded before its forward and the ``later`` ones backwarded before its backward.
    ``has_fixed``: stage ``s < pp-1`` joins the heads at ``(fixed_position, fixed_unit)``
    ``[fixed_first[s]:fixed_first[s+1]]``; otherwise where stages block.

    Returns (ops each stage ran, heads each stage joined or ran, heads completed, joins per
    stage, their op positions and units as ``(pp, capacity)`` arrays)."""
    pp = len(stage_first) - 1
    last = pp * vpp - 1
    done_f = np.zeros((pp, vpp, num_slices), dtype=np.bool_)
    done_b = np.zeros((pp, vpp, num_slices), dtype=np.bool_)
    seen = np.full(num_slices, -1, dtype=np.int64)  # stamp of the _in_order call that saw it
    stamp = 0
    # One FIFO per receiving stage and direction, of messages ``unit * blocks + block``; a
    # stage receives at most one message per op of the stage sending to it.
    blocks = pp * vpp
    capacity = 1
    for s in range(pp):
        capacity = max(capacity, stage_first[s + 1] - stage_first[s] + 1)
    f_msg = np.empty((pp, capacity), dtype=np.int64)
    b_msg = np.empty((pp, capacity), dtype=np.int64)
    f_head = np.zeros(pp, dtype=np.int64)
    f_tail = np.zeros(pp, dtype=np.int64)
    b_head = np.zeros(pp, dtype=np.int64)
    b_tail = np.zeros(pp, dtype=np.int64)
    pos = stage_first[:pp].copy()
    joined = np.zeros(pp, dtype=np.int64)
    taken = np.zeros(pp, dtype=np.int64)
    join_capacity = capacity + len(fixed_position)  # a join per head, or the fixed ones
    join_count = np.zeros(pp, dtype=np.int64)
    join_position = np.empty((pp, join_capacity), dtype=np.int64)
    join_unit = np.empty((pp, join_capacity), dtype=np.int64)
    heads_done = 0
    while True:
        progress = False
        for s in range(pp):
            while joined[s] <= heads_done:
                if has_fixed and s < pp - 1 and taken[s] < fixed_first[s + 1] - fixed_first[s]:
                    k = fixed_first[s] + taken[s]
                    if fixed_position[k] == pos[s] - stage_first[s]:
                        join_position[s, join_count[s]] = fixed_position[k]
                        join_unit[s, join_count[s]] = fixed_unit[k]
                        join_count[s] += 1
                        taken[s] += 1
                        joined[s] += 1
                        progress = True
                        continue
                i = pos[s]
                if i == stage_first[s + 1]:
                    break
                stamp += 1
                if not _ready(s, i, pp, last, is_forward, unit, chunk, forward_first,
                              forward_ids, backward_first, backward_ids, earlier_first,
                              earlier_ids, later_first, later_ids, done_f, done_b, seen, stamp,
                              blocks, f_msg, f_head, f_tail, b_msg, b_head, b_tail):
                    break
                if vocab_over_pp and s == pp - 1 and is_forward[i] and chunk[i] == vpp - 1:
                    waiting = False
                    for t in range(pp - 1):
                        if joined[t] <= heads_done:
                            waiting = True
                            break
                    if waiting:
                        break
                    heads_done += 1
                    joined[s] = heads_done
                block = chunk[i] * pp + s
                c = chunk[i]
                if is_forward[i]:
                    if block > 0:
                        f_head[s] += 1
                    for k in range(forward_first[unit[i]], forward_first[unit[i] + 1]):
                        done_f[s, c, forward_ids[k]] = True
                    if block < last:
                        r = (s + 1) % pp
                        f_msg[r, f_tail[r]] = unit[i] * blocks + block + 1
                        f_tail[r] += 1
                else:
                    if block < last:
                        b_head[s] += 1
                    for k in range(backward_first[unit[i]], backward_first[unit[i] + 1]):
                        done_b[s, c, backward_ids[k]] = True
                    if block > 0:
                        r = (s - 1) % pp
                        b_msg[r, b_tail[r]] = unit[i] * blocks + block - 1
                        b_tail[r] += 1
                pos[s] += 1
                progress = True
        if progress:
            continue
        # Every stage is blocked. If the last stage waits only for the others to join the
        # head of its next op, each joins where it stands: it was waiting there anyway.
        s = pp - 1
        i = pos[s]
        if has_fixed or not vocab_over_pp or i == stage_first[s + 1]:
            break
        if not (is_forward[i] and chunk[i] == vpp - 1):
            break
        stamp += 1
        if not _ready(s, i, pp, last, is_forward, unit, chunk, forward_first, forward_ids,
                      backward_first, backward_ids, earlier_first, earlier_ids, later_first,
                      later_ids, done_f, done_b, seen, stamp, blocks, f_msg, f_head, f_tail,
                      b_msg, b_head, b_tail):
            break
        for t in range(pp - 1):
            join_position[t, join_count[t]] = pos[t] - stage_first[t]
            join_unit[t, join_count[t]] = unit[i]
            join_count[t] += 1
            joined[t] += 1
    return pos - stage_first[:pp], joined, heads_done, join_count, join_position, join_unit


@numba.njit(cache=True, nogil=True)
def _ready(s: int, i: int, pp: int, last: int, is_forward: np.ndarray, unit: np.ndarray,
           chunk: np.ndarray, forward_first: np.ndarray, forward_ids: np.ndarray,
           backward_first: np.ndarray, backward_ids: np.ndarray, earlier_first: np.ndarray,
           earlier_ids: np.ndarray, later_first: np.ndarray, later_ids: np.ndarray,
           done_f: np.ndarray, done_b: np.ndarray, seen: np.ndarray, stamp: int,
           blocks: int, f_msg: np.ndarray, f_head: np.ndarray, f_tail: np.ndarray,
           b_msg: np.ndarray, b_head: np.ndarray, b_tail: np.ndarray) -> bool:
    """Whether op ``i`` of stage ``s`` can run now (``stamp``: fresh for this call)."""
    c = chunk[i]
    u = unit[i]
    block = c * pp + s
    if is_forward[i]:
        # A slice may follow the same sequence's earlier slices forwarded before, or listed
        # before it in the unit.
        if not _in_order(forward_first[u], forward_first[u + 1], forward_ids, earlier_first,
                         earlier_ids, done_f[s, c], seen, stamp):
            return False
        if block == 0:
            return True
        return f_head[s] < f_tail[s] and f_msg[s, f_head[s]] == u * blocks + block
    for k in range(backward_first[u], backward_first[u + 1]):
        if not done_f[s, c, backward_ids[k]]:
            return False
    if not _in_order(backward_first[u], backward_first[u + 1], backward_ids, later_first,
                     later_ids, done_b[s, c], seen, stamp):
        return False
    if block == last:
        return True
    return b_head[s] < b_tail[s] and b_msg[s, b_head[s]] == u * blocks + block


@numba.njit(cache=True, nogil=True)
def _in_order(start: int, end: int, ids: np.ndarray, need_first: np.ndarray,
              need_ids: np.ndarray, done: np.ndarray, seen: np.ndarray, stamp: int) -> bool:
    """Whether each slice ``ids[start:end]`` finds the slices it needs done already or listed
    before it (marked ``seen`` with ``stamp``)."""
    for k in range(start, end):
        x = ids[k]
        for m in range(need_first[x], need_first[x + 1]):
            y = need_ids[m]
            if not done[y] and seen[y] != stamp:
                return False
        seen[x] = stamp
    return True
