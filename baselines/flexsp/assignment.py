"""One micro-batch's SP groups: the greedy answer and the MILP (arXiv 2412.01523, section 4).

A *solution* is a list of groups ``(degree, member indices)``; degrees are powers of two whose
sum is at most N, so the groups tile the N slots as aligned blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from baselines.flexsp.bucketing import Bucket
from baselines.flexsp.constants import FlexSPConstants
from slimpack.planning import lpt_partition
from slimpack.planning.highs import new_highs


@dataclass(frozen=True, kw_only=True)
class SPGroup:
    degree: int
    members: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Assignment:
    groups: tuple[SPGroup, ...]
    seconds: float
    """Estimated micro-batch time: the slowest group, priced at true lengths."""
    source: str
    """'greedy', 'milp' (solved to the gap), 'milp-node-limit' (the incumbent when the
    deterministic node limit stopped the search) or 'milp-timeout' (the incumbent when the
    wall-clock safety net stopped it: the one answer that depends on the machine)."""


def group_seconds(lengths: Sequence[int], members: Sequence[int], degree: int,
                  k: FlexSPConstants) -> float:
    return k.beta1_s + sum(k.seq_seconds(lengths[i], degree) for i in members)


def group_fits(lengths: Sequence[int], members: Sequence[int], degree: int,
               k: FlexSPConstants) -> bool:
    return sum(lengths[i] for i in members) <= k.max_tokens(degree)


def _degrees(n: int) -> list[int]:
    out, d = [], 1
    while d <= n:
        out.append(d)
        d *= 2
    return out


def ulysses_degrees(num_slots: int, local_heads: int) -> list[int]:
    """The SP degrees a Ulysses group may take: powers of two up to ``num_slots`` that divide
    ``local_heads`` (the attention heads one tensor-parallel rank holds). Ulysses' all-to-all
    gives each rank of a group whole heads, so a degree above the head count, or one that
    does not divide it, is no Ulysses group (DeepSpeed-Ulysses requires the head count to be
    divisible by the SP degree; its later uneven-heads split, deepspeedai/DeepSpeed #6392,
    still needs at least one head per rank). The runtime refuses such groups too
    (``slimpack.runtime.cp_checks``)."""
    if local_heads < 1:
        raise ValueError(f"local_heads must be >= 1, got {local_heads}")
    return [d for d in _degrees(num_slots) if local_heads % d == 0]


def greedy(lengths: Sequence[int], num_slots: int, k: FlexSPConstants,
           degrees: Sequence[int] | None = None) -> Assignment | None:
    """Homogeneous SP (DeepSpeed-Ulysses style) at the best uniform degree (among ``degrees``,
    default every power of two up to N): LPT sequences over N/d groups under the memory cap.
    None when no degree fits the micro-batch."""
    best: Assignment | None = None
    for d in (_degrees(num_slots) if degrees is None else degrees):
        if max(lengths) > k.max_tokens(d):
            continue
        count = num_slots // d
        loads = [0] * count

        def fits(g: int, i: int, d: int = d, loads: list[int] = loads) -> bool:
            return loads[g] + lengths[i] <= k.max_tokens(d)

        parts = lpt_partition([k.seq_seconds(n, d) for n in lengths], count, fits=fits)
        if not all(group_fits(lengths, p, d, k) for p in parts):
            continue
        groups = tuple(SPGroup(degree=d, members=tuple(p)) for p in parts if p)
        secs = max(group_seconds(lengths, g.members, d, k) for g in groups)
        if best is None or secs < best.seconds:
            best = Assignment(groups=groups, seconds=secs, source="greedy")
    return best


def milp(lengths: Sequence[int], buckets: Sequence[Bucket], num_slots: int, k: FlexSPConstants,
         *, time_limit_s: float, warm: Assignment | None, mip_rel_gap: float = 1e-2,
         max_nodes: int | None = None, sub_mip_heuristics: bool = True,
         degrees: Sequence[int] | None = None) -> Assignment | None:
    """The FlexSP MILP over bucket counts (HiGHS), warm-started from ``warm``.

    ``max_nodes`` bounds the search by deterministic work (the same answer on every machine);
    ``time_limit_s`` is a wall-clock safety net on top of it (see :func:`new_highs`).
    ``degrees``: the group degrees allowed (default every power of two up to N).

    min C  s.t.  sum_g x[b,g] = count_b;  x[b,g] <= count_b * u[g];  sum_g d_g u[g] <= N;
    sum_b x[b,g] bound_b act / d_g <= E;  beta1 u[g] + sum_b x[b,g] t(bound_b, d_g) <= C;
    u[g] >= u[g+1] within a degree (symmetry breaking, ECOSYSTEM notes).
    """
    import highspy
    import numpy as np

    if time_limit_s <= 0:
        return None
    candidates: list[int] = []  # degree of each candidate group
    n_seq = sum(b.count for b in buckets)
    for d in (_degrees(num_slots) if degrees is None else degrees):
        if buckets[0].bound > k.max_tokens(d) and all(b.bound > k.max_tokens(d) for b in buckets):
            continue
        candidates.extend([d] * min(num_slots // d, n_seq))
    if not candidates:
        return None
    ng = len(candidates)
    # Columns: x[b,g] (b-major) where bucket b fits degree g, then u[g], then C.
    x_index: dict[tuple[int, int], int] = {}
    for b, bucket in enumerate(buckets):
        for g, d in enumerate(candidates):
            if bucket.bound <= k.max_tokens(d):
                x_index[(b, g)] = len(x_index)
    nx = len(x_index)
    u0, c_col = nx, nx + ng
    ncol = nx + ng + 1
    lower = np.zeros(ncol)
    upper = np.empty(ncol)
    for (b, _g), j in x_index.items():
        upper[j] = buckets[b].count
    upper[u0:u0 + ng] = 1.0
    upper[c_col] = highspy.kHighsInf
    cost = np.zeros(ncol)
    cost[c_col] = 1.0
    rows: list[tuple[float, float, list[int], list[float]]] = []
    inf = highspy.kHighsInf
    for b, bucket in enumerate(buckets):
        idx = [j for (bb, _), j in x_index.items() if bb == b]
        if not idx:
            return None  # a bucket no degree can hold: this micro-batch is infeasible
        rows.append((bucket.count, bucket.count, idx, [1.0] * len(idx)))
    for g, d in enumerate(candidates):
        xs = [(b, j) for (b, gg), j in x_index.items() if gg == g]
        for b, j in xs:  # x[b,g] <= count_b u[g]
            rows.append((-inf, 0.0, [j, u0 + g], [1.0, -float(buckets[b].count)]))
        budget = k.max_tokens(d)
        rows.append((-inf, 0.0, [j for _, j in xs] + [u0 + g],
                     [float(buckets[b].bound) for b, _ in xs] + [-budget]))
        rows.append((-inf, 0.0, [j for _, j in xs] + [u0 + g, c_col],
                     [k.seq_seconds(buckets[b].bound, d) for b, _ in xs] + [k.beta1_s, -1.0]))
        if g + 1 < ng and candidates[g + 1] == d:
            rows.append((0.0, inf, [u0 + g, u0 + g + 1], [1.0, -1.0]))
    rows.append((-inf, float(num_slots), list(range(u0, u0 + ng)), [float(d) for d in candidates]))

    h = new_highs(time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap, mip_max_nodes=max_nodes,
                  sub_mip_heuristics=sub_mip_heuristics)
    h.addVars(ncol, lower, upper)
    h.changeColsCost(ncol, np.arange(ncol, dtype=np.int32), cost)
    integer = np.arange(nx + ng, dtype=np.int32)
    h.changeColsIntegrality(len(integer), integer,
                            np.full(len(integer), highspy.HighsVarType.kInteger))
    for lo, hi, idx, vals in rows:
        h.addRow(lo, hi, len(idx), np.array(idx, dtype=np.int32), np.array(vals, dtype=float))
    if warm is not None:
        start = _warm_vector(warm, lengths, buckets, candidates, x_index, ncol, u0, c_col, k)
        if start is not None:
            sol = highspy.HighsSolution()
            sol.col_value = list(start)
            sol.value_valid = True
            h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    if h.getInfo().primal_solution_status != 2:  # no feasible point found in time
        return None
    values = np.asarray(h.getSolution().col_value)
    groups = _decode(values, buckets, candidates, x_index, u0)
    secs = max(group_seconds(lengths, g.members, g.degree, k) for g in groups)
    source = _source(status)
    return Assignment(groups=tuple(groups), seconds=secs, source=source)


def _source(status) -> str:
    """Which limit stopped HiGHS, as an :attr:`Assignment.source`."""
    import highspy

    kind = highspy.HighsModelStatus
    # kSolutionLimit is HiGHS's status for a reached node limit (the only such limit set here).
    return {kind.kOptimal: "milp", kind.kSolutionLimit: "milp-node-limit",
            kind.kTimeLimit: "milp-timeout"}.get(status, "milp-stopped")


def _warm_vector(warm, lengths, buckets, candidates, x_index, ncol, u0, c_col, k):
    import numpy as np

    bucket_of = {i: b for b, bucket in enumerate(buckets) for i in bucket.members}
    vec = np.zeros(ncol)
    taken: dict[int, int] = {}
    worst = 0.0
    for group in warm.groups:
        d = group.degree
        pos = next((g for g, dd in enumerate(candidates) if dd == d and g not in taken), None)
        if pos is None:
            return None
        taken[pos] = 1
        vec[u0 + pos] = 1.0
        secs = k.beta1_s
        for i in group.members:
            j = x_index.get((bucket_of[i], pos))
            if j is None:
                return None
            vec[j] += 1.0
            secs += k.seq_seconds(buckets[bucket_of[i]].bound, d)
        worst = max(worst, secs)
    vec[c_col] = worst
    return vec


def _decode(values, buckets, candidates, x_index, u0) -> list[SPGroup]:
    remaining = [sorted(b.members) for b in buckets]
    members: dict[int, list[int]] = {}
    for (b, g), j in x_index.items():
        count = int(round(values[j]))
        if count > 0:
            take, remaining[b] = remaining[b][:count], remaining[b][count:]
            members.setdefault(g, []).extend(take)
    # Rounding can leave a member unplaced; give it to the group of its bucket with most room.
    for b, rest in enumerate(remaining):
        for i in rest:
            g = next(gg for (bb, gg) in x_index if bb == b)
            members.setdefault(g, []).append(i)
    return [SPGroup(degree=candidates[g], members=tuple(m)) for g, m in sorted(members.items())]
