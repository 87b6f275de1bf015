"""The unit-time walk's inner loop, compiled (numba): ops on flat arrays, one tick each.

:func:`slimpack.schedules.validate.unit_time_walk` owns the semantics (list order on a stage,
each op after the op producing its input) and the schedule builder's repair loop runs the
same walk as a deadlock check; both hand their ops here as integer keys. Planners run it once
per warm-up tried and per candidate group over ~10^6 ops, and a walk over dependent ops does
not vectorise, so it is compiled rather than written in numpy (integer arithmetic only: the
same ticks as the walk written in Python, checked in ``tests/test_compiled_walks``).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def walk_ticks(stage_first: np.ndarray, key: np.ndarray, need: np.ndarray, size: int):  # noqa: ANN201
    """Stage ``s`` runs ops ``stage_first[s]:stage_first[s+1]`` in order; op ``i`` marks
    ``key[i]`` done and first waits for ``need[i]`` (``size``: nothing). Keys are in
    ``[0, size)`` and each is produced once. Returns (ops each stage ran, start tick per op;
    ops that never ran keep tick -1)."""
    pp = len(stage_first) - 1
    done = np.full(size + 1, -1, dtype=np.int64)  # key -> the tick after its op ends
    done[size] = 0
    waiter = np.full(size + 1, -1, dtype=np.int64)
    ticks = np.full(len(key), -1, dtype=np.int64)
    pos = stage_first[:pp].copy()
    free = np.zeros(pp, dtype=np.int64)
    work = np.empty(pp + size + 1, dtype=np.int64)
    top = 0
    for s in range(pp - 1, -1, -1):
        work[top] = s
        top += 1
    while top > 0:
        top -= 1
        stage = work[top]
        i = pos[stage]
        n = stage_first[stage + 1]
        start_free = free[stage]
        while i < n:
            ready = done[need[i]]
            if ready < 0:
                waiter[need[i]] = stage
                break
            start = ready if ready > start_free else start_free
            ticks[i] = start
            start_free = start + 1
            k = key[i]
            done[k] = start_free
            i += 1
            w = waiter[k]
            if w >= 0:
                waiter[k] = -1
                work[top] = w
                top += 1
        pos[stage] = i
        free[stage] = start_free
    return pos - stage_first[:pp], ticks
