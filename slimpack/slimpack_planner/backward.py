"""Backward MicroPacks that regroup long-sequence work too (issue 13 item 4, *reconstructed*).

A round's forward MicroPacks hold long-sequence segments of equal *forward* cost. Their
backward costs are not equal: attention's backward/forward ratio differs from the GEMMs' and
attention's share grows with the KV prefix, so mirroring the forward segments leaves the
round's backward steps unbalanced, and a round that memory fills with long work has no short
documents to even them out.

Here each long sequence gets a second set of cuts, balanced on cumulative *backward* cost,
and is held in *sub-slices* between the union of its forward and backward cuts. A forward
MicroPack runs the sub-slices of its forward segment (in increasing order); a backward
MicroPack runs those of its backward segment (in decreasing order). Every sub-slice has its
own autograd graph and a sequence's sub-slices are backwarded last-first, so the causal rule
(slice k's backward needs dK/dV of every later slice) holds and nothing is recomputed. The
short-document atoms are then dealt, heaviest first, to the lightest backward MicroPack (LPT
on backward cost), as before.

Backward segment j of a sequence goes to the backward MicroPack that mirrors its forward
segment j (forward step u -> backward step n-1-u), so a round's backward still starts with
the last tokens of each sequence.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from slimpack.plan import Segment
from slimpack.slimpack_planner.estimate import WorkEstimator

TILE = 128
MIN_SUB_SLICE = 4 * TILE
"""Thinnest sub-slice: a backward cut closer than this to a forward cut is moved onto it (a
sliver adds a slice, with its own tile rounding, for almost no balance)."""


def backward_cuts(segments: list[Segment], est: WorkEstimator, *, align: int = TILE) -> list[int]:
    """Cuts of the span of ``segments`` (consecutive, in order) into as many pieces of equal
    backward cost, on ``align``-token tiles.

    Each forward segment is priced exactly (``est.backward(tokens, prefix)``: the simulator's
    own pricing of a piece with its KV prefix); inside a segment the cumulative cost follows
    the shape of a whole document's backward ``B(x)``, which grows faster than linearly
    (causal attention). So k exact prices per sequence, not one per bisection step.
    """
    k = len(segments)
    first, last = segments[0].start, segments[-1].end
    if k <= 1:
        return [first, last]
    prices = [est.backward(s.num_tokens, s.start) if s.start else est.backward(s.num_tokens)
              for s in segments]
    cum = [0.0]
    for p in prices:
        cum.append(cum[-1] + p)
    total = cum[-1]

    def cost_to(x: int) -> float:
        """Backward cost of [first, x), x inside the span."""
        j = max(i for i in range(k) if segments[i].start <= x) if x < last else k - 1
        seg = segments[j]
        lo, hi = est.backward(seg.start), est.backward(seg.end)
        share = (est.backward(x) - lo) / (hi - lo) if hi > lo else (x - seg.start) / seg.num_tokens
        return cum[j] + prices[j] * min(max(share, 0.0), 1.0)

    cuts = [first]
    for j in range(1, k):
        target = total * j / k
        lo, hi = cuts[-1] // align + 1, last // align
        while lo < hi:
            mid = (lo + hi) // 2
            if cost_to(mid * align) < target:
                lo = mid + 1
            else:
                hi = mid
        x = lo * align
        if x >= last:
            break
        cuts.append(x)
    cuts.append(last)
    return cuts


def sub_slice_cuts(forward: list[int], backward: list[int], min_tokens: int) -> list[int]:
    """Union of forward and backward cuts; a backward cut closer than ``min_tokens`` to a kept
    cut is snapped away (dropped), so no sub-slice is thinner than the forward slices allow."""
    kept = sorted(set(forward))
    for c in backward[1:-1]:
        i = next((j for j, k in enumerate(kept) if k >= c), len(kept))
        left = kept[i - 1] if i > 0 else None
        right = kept[i] if i < len(kept) else None
        if (left is None or c - left >= min_tokens) and (right is None or right - c >= min_tokens):
            kept.insert(i, c)
    return kept


def emit_round(long_segments: list[list[Segment]], short_atoms: list[list[tuple[Segment, ...]]],
               est: WorkEstimator, new_slice: Callable[[tuple[Segment, ...]], int], *,
               min_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """Slices of one round and its forward and backward MicroPacks (lists of slice ids).

    ``long_segments[u]``: the long-sequence segments of forward MicroPack ``u``;
    ``short_atoms[u]``: its short documents, grouped into atom slices. Returns
    ``(forward, backward)``: per MicroPack of the round, its slice ids in run order.
    """
    n = len(long_segments)
    forward: list[list[int]] = [[] for _ in range(n)]
    back: list[list[int]] = [[] for _ in range(n)]
    bwd_load = [0.0] * n
    # A sequence's segments in this round, in forward order, with their forward MicroPack.
    per_seq: dict[int, list[tuple[int, Segment]]] = {}
    for u in range(n):
        for seg in long_segments[u]:
            per_seq.setdefault(seg.seq_id, []).append((u, seg))
    starts: dict[int, int] = {}  # sub-slice id -> its first token
    for seq_id, segs in per_seq.items():
        segs.sort(key=lambda x: x[1].start)
        fwd_cuts = [s.start for _, s in segs] + [segs[-1][1].end]
        k = len(segs)
        bwd_cuts = backward_cuts([s for _, s in segs], est)
        cuts = sub_slice_cuts(fwd_cuts, bwd_cuts, max(min_tokens, MIN_SUB_SLICE))
        # A backward cut that was dropped moves to the nearest kept cut (a backward segment
        # may then be empty: its MicroPack gets none of this sequence).
        snapped = [min(cuts, key=lambda c, x=x: (abs(c - x), c)) for x in bwd_cuts]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            piece = Segment(seq_id=seq_id, start=a, end=b)
            sid = new_slice((piece,))
            j_f = max(j for j in range(k) if fwd_cuts[j] <= a)
            forward[segs[j_f][0]].append(sid)
            # Backward segment j runs where the mirror of forward segment j runs.
            j_b = max(j for j in range(min(k, len(snapped) - 1)) if snapped[j] <= a)
            b_unit = n - 1 - segs[j_b][0]
            starts[sid] = a
            back[b_unit].append(sid)
            bwd_load[b_unit] += est.backward(piece.num_tokens, piece.start)
    # Within a backward MicroPack a sequence's pieces run last-first.
    for b in range(n):
        back[b].sort(key=lambda sid: -starts[sid])
    atoms: list[tuple[float, int]] = []
    for u in range(n):
        for segs in short_atoms[u]:
            sid = new_slice(segs)
            forward[u].append(sid)
            atoms.append((sum(est.backward(s.num_tokens) for s in segs), sid))
    heap = [(load, b) for b, load in enumerate(bwd_load)]
    heapq.heapify(heap)
    for cost, sid in sorted(atoms, key=lambda x: (-x[0], x[1])):
        load, b = heapq.heappop(heap)
        back[b].append(sid)
        heapq.heappush(heap, (load + cost, b))
    return forward, back
