"""The order-only memory walk's inner loop, compiled (numba): ops on flat arrays.

:func:`slimpack.sim.memory.op_list_peaks` owns the semantics (each op adds two terms to its
stage's running total, the peak is read after every term) and prepares the arrays. Every
candidate a planner builds and every group the simulator times walks ~10^6 ops here, twice
(with and without the dK/dV buffers), so the running totals are one compiled loop rather
than per-stage numpy passes that build the term arrays first. The additions are the ones
the walk written op by op does, in the same order, so the peaks are the same floats
(``tests/test_memory_walk.py``).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def stage_peaks(stage_first: np.ndarray, is_fwd: np.ndarray, unit: np.ndarray,
                layers: np.ndarray, start: np.ndarray, fwd_alloc: np.ndarray,
                fwd_offload: np.ndarray, bwd_alloc: np.ndarray, bwd_release: np.ndarray,
                fetch: np.ndarray, bwd_free: np.ndarray, with_activations: bool,
                ):  # noqa: ANN201 (two arrays)
    """Stage ``s`` runs ops ``stage_first[s]:stage_first[s+1]``; op ``i`` runs on
    ``layers[i]`` layers of unit ``unit[i]``. Per stage, from ``start[s]``: the largest
    running total of the dynamic bytes (F: ``+fwd_alloc``, ``-fwd_offload``; B:
    ``+bwd_alloc``, ``-bwd_release``; each times the op's layers) and, with
    ``with_activations``, of the activations alone (B: ``+fetch``, ``-bwd_free``)."""
    pp = len(stage_first) - 1
    dynamic = np.zeros(pp, dtype=np.float64)
    activations = np.zeros(pp, dtype=np.float64)
    for s in range(pp):
        total = start[s]
        peak = total
        act = start[s]
        act_peak = act
        for i in range(stage_first[s], stage_first[s + 1]):
            u = unit[i]
            n = layers[i]
            if is_fwd[i]:
                grow = fwd_alloc[u] * n
                shrink = -(fwd_offload[u] * n)
                act_grow, act_shrink = grow, shrink
            else:
                grow = bwd_alloc[u] * n
                shrink = -(bwd_release[u] * n)
                act_grow = fetch[u] * n
                act_shrink = -(bwd_free[u] * n)
            total += grow
            if total > peak:
                peak = total
            total += shrink
            if total > peak:
                peak = total
            if with_activations:
                act += act_grow
                if act > act_peak:
                    act_peak = act
                act += act_shrink
                if act > act_peak:
                    act_peak = act
        dynamic[s] = peak
        activations[s] = act_peak
    return dynamic, activations


@numba.njit(cache=True, nogil=True)
def run_sums(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``out[k]`` = ``values[bounds[k]:bounds[k+1]]`` summed left to right from 0.0: a unit's
    bytes as the sum of its slices' in the unit's order (numpy's reductions sum pairwise,
    which rounds differently)."""
    out = np.zeros(len(bounds) - 1, dtype=np.float64)
    for k in range(len(bounds) - 1):
        total = 0.0
        for i in range(bounds[k], bounds[k + 1]):
            total += values[i]
        out[k] = total
    return out
