"""Phase 2: slices and asymmetric forward/backward MicroPacks for one replica (*reconstructed*).

A replica's work becomes a sequence of *rounds*. A round is like one SlimPipe micro-batch
that may hold several sequences: its long sequences are forwarded slice by slice and then
backwarded in reverse, so a round's activations must fit in memory together. Every
MicroPack (pipeline step) of every round should take the same forward time, because the
pipeline runs at the pace of its slowest step.

1. **Rounds of long sequences.** Sequences longer than S are first-fit-decreasing packed into
   rounds of at most ``round_capacity`` tokens.
2. **Cost-balanced slicing.** A long sequence is cut into segments of equal *forward cost*,
   not equal length (a slice with KV prefix p costs more per token than one without), each
   at most S tokens, cuts on 128-token tiles. Segment j of a round's sequence occupies one
   MicroPack of that round, in order.
3. **Global fill.** The replica needs about ``total forward / target`` MicroPacks; those not
   taken by long segments form filler rounds. Short documents are then dealt, heaviest first,
   to the lightest MicroPack of *any* round (LPT) while its round has token room, so every
   step ends at about the same forward time.
4. **Backward MicroPacks.** Long segments mirror their forward position within their round
   (segment in forward step u goes to backward step n-1-u), which gives the reverse-order rule;
   each step's short documents are held in a few *atom slices* that are dealt again, LPT on
   *backward* cost, over the round's backward steps. Linear work costs 2x forward and
   attention about 2.5x, so forward-balanced steps are not backward-balanced; the re-deal
   fixes that without recompute, because every slice has its own autograd graph.

With ``asymmetric=False`` the backward MicroPacks are the forward ones in reverse order.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from slimpack.plan import Segment, Slice, Unit
from slimpack.solver.estimate import WorkEstimator

TILE = 128
ATOMS_PER_UNIT = 4
"""Short documents of one forward MicroPack are held in this many atom slices, the granularity
at which backward MicroPacks may regroup them (more atoms: finer balance, more slices)."""


@dataclass(kw_only=True)
class ReplicaPacks:
    slices: list[Slice] = field(default_factory=list)
    forward_units: list[Unit] = field(default_factory=list)
    backward_units: list[Unit] = field(default_factory=list)


@dataclass(kw_only=True)
class _Round:
    capacity: int
    tokens: int = 0
    long_segments: list[list[Segment]] = field(default_factory=list)
    """Per MicroPack of this round: its long-sequence segments."""
    short_docs: list[list[int]] = field(default_factory=list)
    """Per MicroPack: seq_ids of whole short documents."""

    def add_units(self, count: int) -> None:
        self.long_segments.extend([] for _ in range(count))
        self.short_docs.extend([] for _ in range(count))

    @property
    def num_units(self) -> int:
        return len(self.long_segments)


def cost_balanced_cuts(length: int, pieces: int, est: WorkEstimator, *, align: int = TILE) -> list[int]:
    """Boundaries 0 = b0 < b1 < ... < bk = length giving segments of equal forward cost.

    The forward cost of the first x tokens, ``F(x) = est.forward(x)``, grows faster than
    linearly (causal attention), so the cut for segment j solves ``F(b_j) = j*F(L)/k`` by
    bisection over multiples of ``align``; slicing conserves attention pairs, so a segment
    [a, b) costs about F(b) - F(a).
    """
    if pieces <= 1 or length <= align:
        return [0, length]
    total = est.forward(length)
    cuts = [0]
    for j in range(1, pieces):
        target = total * j / pieces
        lo, hi = cuts[-1] // align + 1, length // align  # in tiles
        while lo < hi:
            mid = (lo + hi) // 2
            if est.forward(mid * align) < target:
                lo = mid + 1
            else:
                hi = mid
        x = lo * align
        if x >= length:
            break
        cuts.append(x)
    cuts.append(length)
    return cuts


def slice_sequence(length: int, est: WorkEstimator, *, slice_tokens: int, target: float) -> list[int]:
    """Cuts of one long sequence: equal forward cost, each segment at most ``slice_tokens``.

    Enough pieces that none exceeds a MicroPack's forward budget; more while the first
    (longest, cheapest-per-token) segment is longer than S.
    """
    pieces = max(math.ceil(length / slice_tokens), math.ceil(est.forward(length) / target), 1)
    while True:
        cuts = cost_balanced_cuts(length, pieces, est)
        if max(b - a for a, b in zip(cuts[:-1], cuts[1:], strict=True)) <= slice_tokens \
                or pieces >= math.ceil(length / TILE):
            return cuts
        pieces += 1


def make_rounds(lengths: dict[int, int], capacity: int) -> list[list[int]]:
    """First-fit decreasing of sequences into rounds of at most ``capacity`` tokens."""
    rounds: list[list[int]] = []
    room: list[int] = []
    for seq_id in sorted(lengths, key=lambda s: (-lengths[s], s)):
        n = lengths[seq_id]
        for r, free in enumerate(room):
            if n <= free:
                rounds[r].append(seq_id)
                room[r] -= n
                break
        else:
            rounds.append([seq_id])
            room.append(max(capacity - n, 0))
    return rounds


def pack_replica(lengths: dict[int, int], est: WorkEstimator, *, slice_tokens: int | None,
                 round_capacity: int, unit_forward_target: float, asymmetric: bool) -> ReplicaPacks:
    """Slices and MicroPacks for one replica's sequences.

    ``slice_tokens`` None disables slicing (every sequence stays whole and is a "short"
    document); ``unit_forward_target`` is the forward seconds one MicroPack should take (the
    same across replicas, so every pipeline step is about equally long).
    """
    target = unit_forward_target
    long_limit = slice_tokens if slice_tokens is not None else math.inf
    long_ids = {s: n for s, n in lengths.items() if n > long_limit}
    short_ids = {s: n for s, n in lengths.items() if n <= long_limit}

    # 1-2. Rounds of long sequences, sliced on cost, one segment per MicroPack in order.
    rounds: list[_Round] = []
    fwd_load: list[list[float]] = []
    for members in make_rounds(long_ids, round_capacity) if long_ids else []:
        rnd = _Round(capacity=max(round_capacity, sum(long_ids[s] for s in members)))
        loads: list[float] = []
        for seq_id in sorted(members, key=lambda s: -long_ids[s]):
            length = long_ids[seq_id]
            cuts = slice_sequence(length, est, slice_tokens=slice_tokens, target=target)
            k = len(cuts) - 1
            if k > rnd.num_units:
                rnd.add_units(k - rnd.num_units)
                loads.extend([0.0] * (k - len(loads)))
            offset = _lightest_window(loads, k)
            for j in range(k):
                seg = Segment(seq_id=seq_id, start=cuts[j], end=cuts[j + 1])
                rnd.long_segments[offset + j].append(seg)
                loads[offset + j] += est.forward(seg.num_tokens, seg.start)
            rnd.tokens += length
        rounds.append(rnd)
        fwd_load.append(loads)

    # 3. Filler rounds for the MicroPacks short documents need beyond the long rounds'.
    short_fwd = {s: est.forward(n) for s, n in short_ids.items()}
    total = sum(sum(loads) for loads in fwd_load) + sum(short_fwd.values())
    wanted = max(1, round(total / target)) if target > 0 else 1
    if slice_tokens is None:
        wanted = min(wanted, len(lengths))
    spare = wanted - sum(r.num_units for r in rounds)
    if short_ids and (spare > 0 or not rounds):
        spare = max(spare, 1)
        mean_short = sum(short_ids.values()) / spare
        per_round = max(1, int(round_capacity // max(mean_short, 1)))
        while spare > 0:
            n = min(spare, per_round)
            rnd = _Round(capacity=round_capacity)
            rnd.add_units(n)
            rounds.append(rnd)
            fwd_load.append([0.0] * n)
            spare -= n
    _fill_short_documents(rounds, fwd_load, short_ids, short_fwd)

    # 4. Slices and the two partitions, round by round, fewest MicroPacks first. The
    # schedule keeps as many MicroPacks in flight as the first round needs (plus the 2(p-1)
    # warm-up) for the rest of the step; a small first round keeps that floor low.
    out = ReplicaPacks()
    for rnd in sorted(rounds, key=lambda r: r.num_units):
        _emit_round(rnd, lengths, est, asymmetric, out)
    return out


def _fill_short_documents(rounds: list[_Round], fwd_load: list[list[float]],
                          short_ids: dict[int, int], short_fwd: dict[int, float]) -> None:
    """LPT: heaviest document first, into the lightest MicroPack whose round has room."""
    heap = [(load, r, u) for r, loads in enumerate(fwd_load) for u, load in enumerate(loads)]
    heapq.heapify(heap)
    full: list[tuple[float, int, int]] = []
    for seq_id in sorted(short_ids, key=lambda s: (-short_ids[s], s)):
        n = short_ids[seq_id]
        while heap and rounds[heap[0][1]].tokens + n > rounds[heap[0][1]].capacity:
            full.append(heapq.heappop(heap))
        if not heap:  # every round is full: overflow into the lightest step anyway
            heap, full = full, []
            heapq.heapify(heap)
        load, r, u = heapq.heappop(heap)
        rounds[r].short_docs[u].append(seq_id)
        rounds[r].tokens += n
        heapq.heappush(heap, (load + short_fwd[seq_id], r, u))


def _emit_round(rnd: _Round, lengths: dict[int, int], est: WorkEstimator, asymmetric: bool,
                out: ReplicaPacks) -> None:
    n_units = rnd.num_units
    unit_slices: list[list[int]] = [[] for _ in range(n_units)]
    segment_slice: dict[tuple[int, int], int] = {}
    atoms: list[int] = []
    for u in range(n_units):
        for seg in rnd.long_segments[u]:
            sid = _new_slice(out, (seg,))
            segment_slice[(seg.seq_id, seg.start)] = sid
            unit_slices[u].append(sid)
        docs = sorted(rnd.short_docs[u], key=lambda s: -lengths[s])
        if not docs:
            continue
        buckets = lpt_buckets([est.backward(lengths[s]) for s in docs],
                              ATOMS_PER_UNIT if asymmetric else 1)
        for bucket in buckets:
            if bucket:
                segs = tuple(Segment(seq_id=docs[i], start=0, end=lengths[docs[i]]) for i in bucket)
                sid = _new_slice(out, segs)
                unit_slices[u].append(sid)
                atoms.append(sid)
    for u in range(n_units):
        if unit_slices[u]:
            out.forward_units.append(Unit(slice_ids=tuple(unit_slices[u])))
    if not asymmetric:
        for u in reversed(range(n_units)):
            if unit_slices[u]:
                out.backward_units.append(Unit(slice_ids=tuple(reversed(unit_slices[u]))))
        return
    back: list[list[int]] = [[] for _ in range(n_units)]
    bwd_load = [0.0] * n_units
    for u in range(n_units):
        b = n_units - 1 - u
        for seg in sorted(rnd.long_segments[u], key=lambda s: -s.start):
            back[b].append(segment_slice[(seg.seq_id, seg.start)])
            bwd_load[b] += est.backward(seg.num_tokens, seg.start)
    by_id = {sl.slice_id: sl for sl in out.slices[-len(segment_slice) - len(atoms):]}
    atom_cost = {sid: sum(est.backward(seg.num_tokens) for seg in by_id[sid].segments)
                 for sid in atoms}
    heap = [(load, b) for b, load in enumerate(bwd_load)]
    heapq.heapify(heap)
    for sid in sorted(atoms, key=lambda a: -atom_cost[a]):
        load, b = heapq.heappop(heap)
        back[b].append(sid)
        heapq.heappush(heap, (load + atom_cost[sid], b))
    for b in range(n_units):
        if back[b]:
            out.backward_units.append(Unit(slice_ids=tuple(back[b])))


def _new_slice(out: ReplicaPacks, segments: tuple[Segment, ...]) -> int:
    sid = len(out.slices)
    out.slices.append(Slice(slice_id=sid, segments=segments))
    return sid


def _lightest_window(loads: list[float], width: int) -> int:
    """Start of the ``width`` consecutive MicroPacks with the least load so far."""
    n = len(loads)
    if width >= n:
        return 0
    return min(range(n - width + 1), key=lambda o: sum(loads[o:o + width]))


def lpt_buckets(weights: list[float], num_buckets: int) -> list[list[int]]:
    """Indices of ``weights`` split into ``num_buckets`` buckets of balanced total weight."""
    num_buckets = max(1, min(num_buckets, len(weights)))
    heap = [(0.0, b) for b in range(num_buckets)]
    buckets: list[list[int]] = [[] for _ in range(num_buckets)]
    for i in sorted(range(len(weights)), key=lambda j: -weights[j]):
        load, b = heapq.heappop(heap)
        buckets[b].append(i)
        heapq.heappush(heap, (load + weights[i], b))
    return buckets
