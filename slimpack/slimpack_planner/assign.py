"""Phase 1: give each data-parallel replica a set of sequences with balanced work.

The heuristic is LPT (longest processing time first: each sequence, heaviest first, goes to
the least-loaded replica), which is within 4/3 of optimal and takes microseconds. The optional
MILP refines the assignment of the heaviest sequences exactly (HiGHS, time-limited,
warm-started from LPT) while the light tail is treated as fluid filler and re-dealt greedily,
which keeps the model small enough to solve inside a training step.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence

from slimpack.planning.highs import new_highs


def lpt_assign(weights: Sequence[float], num_bins: int, *,
               initial_loads: Sequence[float] | None = None) -> list[list[int]]:
    """Indices of ``weights`` per bin, heaviest first to the least-loaded bin."""
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    loads = list(initial_loads) if initial_loads is not None else [0.0] * num_bins
    heap = [(load, b) for b, load in enumerate(loads)]
    heapq.heapify(heap)
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    # Heaviest first, ties in index order (a stable descending sort keeps them in order).
    for i in sorted(range(len(weights)), key=weights.__getitem__, reverse=True):
        load, b = heap[0]  # (load, bin) keys are unique: replace = pop + push
        bins[b].append(i)
        heapq.heapreplace(heap, (load + weights[i], b))
    return bins


def bin_loads(bins: list[list[int]], weights: Sequence[float]) -> list[float]:
    return [sum(weights[i] for i in b) for b in bins]


def milp_assign(weights: Sequence[float], num_bins: int, *, time_limit_s: float,
                max_exact_items: int = 96) -> tuple[list[list[int]], dict]:
    """Minimise the heaviest bin with HiGHS over the ``max_exact_items`` heaviest items.

    Returns the bins and solver info. Never worse than LPT: the LPT answer is the incumbent
    and is kept whenever the MILP does not beat it within its time limit.
    """
    start = time.perf_counter()
    greedy = lpt_assign(weights, num_bins)
    greedy_max = max(bin_loads(greedy, weights))
    info = {"milp_status": "skipped", "lpt_makespan": greedy_max, "milp_makespan": greedy_max}
    if num_bins == 1 or len(weights) <= num_bins:
        return greedy, info
    try:
        import highspy
    except ImportError:  # pragma: no cover - highspy is a hard dependency
        info["milp_status"] = "highspy missing"
        return greedy, info

    order = sorted(range(len(weights)), key=lambda j: -weights[j])
    exact = order[:max_exact_items]
    tail = order[max_exact_items:]
    tail_total = sum(weights[i] for i in tail)
    n, m = len(exact), num_bins

    h = new_highs(time_limit_s=time_limit_s, mip_rel_gap=1e-4)
    inf = highspy.kHighsInf
    # Variables: x[i, b] binary (n*m), fluid tail share f[b] >= 0 (m), makespan C.
    num_x = n * m
    for _ in range(num_x):
        h.addVar(0.0, 1.0)
    for _ in range(m):
        h.addVar(0.0, inf)
    h.addVar(0.0, inf)
    c_idx = num_x + m
    h.changeColCost(c_idx, 1.0)
    for k in range(num_x):
        h.changeColIntegrality(k, highspy.HighsVarType.kInteger)
    # Each exact item in exactly one bin; symmetry breaking: item i only in bins <= i.
    for i in range(n):
        cols = [i * m + b for b in range(min(m, i + 1))]
        h.addRow(1.0, 1.0, len(cols), cols, [1.0] * len(cols))
        for b in range(i + 1, m):
            h.changeColBounds(i * m + b, 0.0, 0.0)
    # The fluid tail is dealt in full.
    h.addRow(tail_total, tail_total, m, [num_x + b for b in range(m)], [1.0] * m)
    # Bin load <= C.
    for b in range(m):
        cols = [i * m + b for i in range(n)] + [num_x + b, c_idx]
        vals = [weights[exact[i]] for i in range(n)] + [1.0, -1.0]
        h.addRow(-inf, 0.0, len(cols), cols, vals)
    # Warm start from LPT restricted to the exact items (relabelled to respect symmetry).
    solution = highspy.HighsSolution()
    col_values = [0.0] * (num_x + m + 1)
    relabel: dict[int, int] = {}
    for i, item in enumerate(exact):
        b = next(k for k, members in enumerate(greedy) if item in members)
        if b not in relabel:
            relabel[b] = len(relabel)
        col_values[i * m + relabel[b]] = 1.0
    loads = [0.0] * m
    for i, item in enumerate(exact):
        for b in range(m):
            if col_values[i * m + b]:
                loads[b] += weights[item]
    # Fluid tail fills the lightest bins up to a common level.
    level_fill = _water_fill(loads, tail_total)
    for b in range(m):
        col_values[num_x + b] = level_fill[b]
    col_values[c_idx] = max(loads[b] + level_fill[b] for b in range(m))
    solution.col_value = col_values
    solution.value_valid = True
    h.setSolution(solution)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    info["milp_status"] = status
    values = h.getSolution().col_value
    if not values or len(values) < num_x:
        return greedy, info
    bins: list[list[int]] = [[] for _ in range(m)]
    for i, item in enumerate(exact):
        b = max(range(m), key=lambda k: values[i * m + k])
        bins[b].append(item)
    # Re-deal the real tail items greedily on top of the exact assignment.
    base = bin_loads(bins, weights)
    tail_bins = lpt_assign([weights[i] for i in tail], m, initial_loads=base)
    for b in range(m):
        bins[b].extend(tail[j] for j in tail_bins[b])
    makespan = max(bin_loads(bins, weights))
    info["milp_makespan"] = makespan
    info["milp_seconds"] = time.perf_counter() - start
    if makespan > greedy_max:
        info["milp_status"] += " (kept LPT)"
        return greedy, info
    return bins, info


def _water_fill(loads: list[float], amount: float) -> list[float]:
    """Split ``amount`` over bins so the lightest ones rise to a common level."""
    order = sorted(range(len(loads)), key=lambda b: loads[b])
    fill = [0.0] * len(loads)
    remaining = amount
    for k in range(len(order)):
        level_now = loads[order[k]]
        next_level = loads[order[k + 1]] if k + 1 < len(order) else float("inf")
        width = k + 1
        need = (next_level - level_now) * width
        if need >= remaining:
            rise = remaining / width
            target = level_now + rise
            for b in order[:width]:
                fill[b] = target - loads[b]
            return fill
        remaining -= need
        for b in order[:width]:
            fill[b] = next_level - loads[b]
    return fill


def token_assign(lengths: Sequence[int], num_bins: int) -> list[list[int]]:
    """Ablation baseline: balance token counts, not time (what cost-blind packers do)."""
    return lpt_assign([float(n) for n in lengths], num_bins)
