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

import bisect
import heapq
from collections.abc import Callable

from slimpack.plan import Segment
from slimpack.slimpack_planner.estimate import WorkEstimator, first_tile_reaching

TILE = 128
EVEN_ENOUGH = 0.02
"""A sequence whose forward segments' backward prices are within 2% of each other keeps its
forward cuts backward too (short "long" sequences: no sub-slices, no pricing work)."""
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
    if max(prices) <= min(prices) * (1 + EVEN_ENOUGH):
        return [s.start for s in segments] + [last]  # already balanced: nothing to regroup
    cum = [0.0]
    for p in prices:
        cum.append(cum[-1] + p)
    total = cum[-1]
    cuts = [first]
    for j in range(1, k):
        target = total * j / k
        # The segment holding the target, then the tile inside it where B's shape reaches it.
        i = min(bisect.bisect_right(cum, target) - 1, k - 1)
        seg = segments[i]
        b_lo, b_hi = est.backward(seg.start), est.backward(seg.end)
        share = (target - cum[i]) / prices[i] if prices[i] > 0 else 0.0
        goal = b_lo + share * (b_hi - b_lo)
        lo = max(cuts[-1] // align + 1, seg.start // align)
        hi = max(min(last // align, -(-seg.end // align)), lo)
        x = first_tile_reaching(est.backward, goal, lo, hi, align) * align
        if x >= last:
            break
        cuts.append(x)
    cuts.append(last)
    return cuts


def sub_slice_cuts(forward: list[int], backward: list[int], min_tokens: int) -> list[int]:
    """Union of forward and backward cuts; a backward cut closer than ``min_tokens`` to a kept
    cut is snapped away (dropped), so no sub-slice is thinner than the forward slices allow."""
    fwd = sorted(set(forward))
    kept = list(fwd)
    extra = []
    for c in backward[1:-1]:
        # Distance to the nearest forward cut and to the last backward cut kept (both sorted).
        i = bisect.bisect_left(fwd, c)
        near = min(abs(c - fwd[j]) for j in (i - 1, i) if 0 <= j < len(fwd))
        if near >= min_tokens and (not extra or c - extra[-1] >= min_tokens):
            extra.append(c)
    kept.extend(extra)
    return sorted(kept)


def emit_round(long_segments: list[list[Segment]],
               short_atoms: list[list[tuple[tuple[Segment, ...], float]]],
               est: WorkEstimator, new_slice: Callable[[tuple[Segment, ...]], int], *,
               min_tokens: int, regroup_long: bool = True,
               round_warmup: bool = True) -> tuple[list[list[int]], list[list[int]]]:
    """Slices of one round and its forward and backward MicroPacks (lists of slice ids).

    ``long_segments[u]``: the long-sequence segments of forward MicroPack ``u``;
    ``short_atoms[u]``: its short documents, grouped into atom slices, each with its
    backward cost (the sum of its documents' ``est.backward``, in their order). ``regroup_long``
    False: long segments keep their forward cuts backward (mirrored). ``round_warmup``: the
    first backward MicroPack takes an atom of the last forward one (see below). Returns
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
    backward_of = est.backward
    for seq_id, segs in per_seq.items():
        segs.sort(key=lambda x: x[1].start)
        if not regroup_long:
            # Mirrored: the sub-slices are the forward segments (the general path below gives
            # the same slices, and backward segment j in the mirror of forward step u).
            for u, seg in segs:
                sid = new_slice((seg,))
                forward[u].append(sid)
                starts[sid] = seg.start
                back[n - 1 - u].append(sid)
                bwd_load[n - 1 - u] += backward_of(seg.end - seg.start, seg.start)
            continue
        fwd_cuts = [s.start for _, s in segs] + [segs[-1][1].end]
        k = len(segs)
        bwd_cuts = backward_cuts([s for _, s in segs], est)
        cuts = sub_slice_cuts(fwd_cuts, bwd_cuts, max(min_tokens, MIN_SUB_SLICE))
        # A backward cut that was dropped moves to the nearest kept cut (a backward segment
        # may then be empty: its MicroPack gets none of this sequence).
        snapped = [_nearest(cuts, x) for x in bwd_cuts]
        sub = 0  # walks the forward and backward segments along the pieces (both sorted)
        j_b = 0
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            piece = Segment(seq_id=seq_id, start=a, end=b)
            sid = new_slice((piece,))
            while sub + 1 < k and fwd_cuts[sub + 1] <= a:
                sub += 1
            forward[segs[sub][0]].append(sid)
            # Backward segment j runs where the mirror of forward segment j runs.
            while j_b + 1 < min(k, len(snapped) - 1) and snapped[j_b + 1] <= a:
                j_b += 1
            b_unit = n - 1 - segs[j_b][0]
            starts[sid] = a
            back[b_unit].append(sid)
            bwd_load[b_unit] += est.backward(piece.num_tokens, piece.start)
    # Within a backward MicroPack a sequence's pieces run last-first.
    for pieces in back:
        if len(pieces) > 1:
            pieces.sort(key=lambda sid: -starts[sid])
    atoms: list[tuple[float, int]] = []  # (-backward cost, slice id): heaviest sorts first
    for u in range(n):
        unit = forward[u]
        for segs, cost in short_atoms[u]:
            sid = new_slice(segs)
            unit.append(sid)
            atoms.append((-cost, sid))
    if round_warmup:  # the first backward needs the last forward (warm-up = the round)
        _give_first_backward_a_tail_atom(forward, back, bwd_load, atoms)
    heap = [(load, b) for b, load in enumerate(bwd_load)]
    heapq.heapify(heap)
    # Heaviest atom first (ties by slice id) to the lightest backward MicroPack; the keys
    # (load, b) are unique, so replacing the top is popping and pushing. (-cost, sid) pairs
    # sort in C, and load - (-cost) is load + cost exactly.
    heapreplace = heapq.heapreplace
    atoms.sort()
    for neg_cost, sid in atoms:
        load, b = heap[0]
        back[b].append(sid)
        heapreplace(heap, (load - neg_cost, b))
    return forward, back


def _give_first_backward_a_tail_atom(forward: list[list[int]], back: list[list[int]],
                                     bwd_load: list[float],
                                     atoms: list[tuple[float, int]]) -> None:
    """The round's first backward MicroPack must need its last forward one, as when mirrored:
    the schedule sizes its warm-up by what the first backward needs (the round's forwards
    plus 2(p-1)); a first backward of early atoms only would shrink the warm-up to a few
    steps and break the round into bursts of forwards and backwards (measured: 6% slower).
    Moves the last forward MicroPack's heaviest atom from ``atoms`` ((-cost, slice id)
    pairs) to it."""
    last = len(forward) - 1
    while last >= 0 and not forward[last]:
        last -= 1
    tail = set(forward[last]) if last >= 0 else set()
    if tail and not set(back[0]) & tail:
        own = [a for a in atoms if a[1] in tail]
        if own:
            first = min(own)  # the last MicroPack's heaviest atom (ties: the lowest id)
            atoms.remove(first)
            back[0].append(first[1])
            bwd_load[0] -= first[0]  # x - (-cost) is x + cost exactly


def _nearest(sorted_cuts: list[int], x: int) -> int:
    """The cut nearest ``x`` (the lower one on a tie)."""
    i = bisect.bisect_left(sorted_cuts, x)
    options = [sorted_cuts[j] for j in (i - 1, i) if 0 <= j < len(sorted_cuts)]
    return min(options, key=lambda c: (abs(c - x), c))
