"""Phase 2: slices and asymmetric forward/backward MicroPacks for one replica (*reconstructed*).

A replica's sequences are grouped into *rounds*: sets of sequences whose activations fit in
memory together, like one SlimPipe micro-batch but holding many sequences. Each round becomes
``n`` MicroPacks (pipeline steps) of equal forward cost:

1. **Cost-balanced slicing.** A long sequence is cut into segments of equal *forward cost*, not
   equal length: a slice with KV prefix p costs ``l*(lin + att*(p + l/2))``, so later slices are
   shorter. Cuts fall on multiples of 128 tokens (a FlashAttention tile).
2. **Forward MicroPacks.** Segment j of a k-segment sequence goes to MicroPack ``j*n//k``
   (order-preserving), then short documents fill the MicroPacks lightest-first (LPT on forward
   cost), so every MicroPack ends at about the same forward time.
3. **Backward MicroPacks.** Long segments mirror their forward position (segment j in backward
   MicroPack ``n-1-u``), which satisfies the reverse-order rule; the short documents, held in
   small *atom slices*, are dealt again LPT on *backward* cost. Linear work costs 2x forward
   and attention about 2.5x, so forward-balanced MicroPacks are not backward-balanced; the
   re-deal fixes that without recompute because every slice has its own autograd graph.

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


def cost_balanced_cuts(length: int, pieces: int, est: WorkEstimator, *, align: int = TILE) -> list[int]:
    """Boundaries 0 = b0 < b1 < ... < bk = length giving segments of equal forward cost."""
    if pieces <= 1 or length <= align:
        return [0, length]
    lin, att = est.fwd_per_token, est.fwd_per_pair
    total = lin * length + att * length * (length + 1) / 2

    def inverse(target: float) -> float:  # solve lin*x + att*x^2/2 = target
        if att == 0:
            return target / lin
        return (-lin + math.sqrt(lin * lin + 2 * att * target)) / att

    cuts = [0]
    for j in range(1, pieces):
        x = int(round(inverse(total * j / pieces) / align)) * align
        x = max(x, cuts[-1] + align)
        if x >= length:
            break
        cuts.append(x)
    cuts.append(length)
    return cuts


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

    ``slice_tokens`` None disables slicing (whole sequences only); ``unit_forward_target`` is
    the forward seconds one MicroPack should take (the same across replicas and rounds, so
    every pipeline step is about equally long).
    """
    rounds: list[ReplicaPacks] = []
    next_slice_id = 0
    for round_ids in make_rounds(lengths, round_capacity):
        packed = ReplicaPacks()
        _pack_round({s: lengths[s] for s in round_ids}, est, slice_tokens, unit_forward_target,
                    asymmetric, packed, first_slice_id=next_slice_id)
        next_slice_id += len(packed.slices)
        rounds.append(packed)
    # Fewest MicroPacks first. The schedule keeps as many MicroPacks in flight as the first
    # round needs (plus the 2(p-1) warm-up) for the rest of the step, so a large first round
    # would hold that many MicroPacks of every later round in memory; a small first round
    # lets each later round raise the count only while it runs.
    rounds.sort(key=lambda r: len(r.forward_units))
    out = ReplicaPacks()
    for packed in rounds:
        out.slices.extend(packed.slices)
        out.forward_units.extend(packed.forward_units)
        out.backward_units.extend(packed.backward_units)
    return out


def _pack_round(lengths: dict[int, int], est: WorkEstimator, slice_tokens: int | None,
                target: float, asymmetric: bool, out: ReplicaPacks, *, first_slice_id: int) -> None:
    long_limit = slice_tokens if slice_tokens is not None else math.inf
    long_ids = [s for s in lengths if lengths[s] > long_limit]
    short_ids = [s for s in lengths if lengths[s] <= long_limit]
    round_fwd = sum(est.forward(n) for n in lengths.values())
    n_units = max(1, round(round_fwd / target)) if target > 0 else 1
    if slice_tokens is None:
        # Whole sequences only: a unit can hold at most the documents it gets.
        n_units = min(n_units, len(lengths))
    else:
        # Never more units than there are pieces of work to spread.
        max_pieces = sum(math.ceil(lengths[s] / TILE) for s in long_ids) + len(short_ids)
        n_units = min(n_units, max_pieces)

    fwd_load = [0.0] * n_units
    bwd_load = [0.0] * n_units
    fwd_members: list[list[Segment]] = [[] for _ in range(n_units)]
    # -- long sequences: cost-balanced segments spread over the units in order ---------------
    mirrored: list[list[Segment]] = [[] for _ in range(n_units)]
    for seq_id in sorted(long_ids, key=lambda s: -lengths[s]):
        length = lengths[seq_id]
        if slice_tokens is None:
            cuts = [0, length]
        else:
            # Enough pieces that none exceeds S tokens or one MicroPack's forward budget, but
            # never more pieces than units (two pieces of one sequence in one unit is waste).
            wanted = max(math.ceil(length / slice_tokens), math.ceil(est.forward(length) / target))
            cuts = _cap_length(cost_balanced_cuts(length, min(wanted, n_units), est),
                               slice_tokens)
        k = len(cuts) - 1
        # Consecutive units from the lightest window: order-preserving, and several long
        # sequences in one round land side by side instead of piling onto the first units.
        offset = _lightest_window(fwd_load, k)
        for j in range(k):
            start, end = cuts[j], cuts[j + 1]
            u = offset + j if k <= n_units else j * n_units // k
            segment = Segment(seq_id=seq_id, start=start, end=end)
            fwd_members[u].append(segment)
            fwd_load[u] += est.forward(end - start, start)
            mirrored[n_units - 1 - u].append(segment)
            bwd_load[n_units - 1 - u] += est.backward(end - start, start)
    # -- short documents: LPT on forward cost ------------------------------------------------
    short_unit: dict[int, int] = {}
    heap = [(load, u) for u, load in enumerate(fwd_load)]
    heapq.heapify(heap)
    for seq_id in sorted(short_ids, key=lambda s: (-lengths[s], s)):
        load, u = heapq.heappop(heap)
        short_unit[seq_id] = u
        heapq.heappush(heap, (load + est.forward(lengths[seq_id]), u))

    # -- slices: one per long segment, a few atom slices of short documents per unit ---------
    unit_slices: list[list[int]] = [[] for _ in range(n_units)]
    segment_slice: dict[tuple[int, int], int] = {}
    atoms: list[tuple[int, int]] = []  # (slice_id, forward unit)
    for u in range(n_units):
        for segment in fwd_members[u]:
            sid = first_slice_id + len(out.slices)
            out.slices.append(Slice(slice_id=sid, segments=(segment,)))
            segment_slice[(segment.seq_id, segment.start)] = sid
            unit_slices[u].append(sid)
        docs = sorted((s for s, uu in short_unit.items() if uu == u), key=lambda s: -lengths[s])
        if not docs:
            continue
        buckets = lpt_buckets([est.backward(lengths[s]) for s in docs],
                              ATOMS_PER_UNIT if asymmetric else 1)
        for bucket in buckets:
            if not bucket:
                continue
            segs = tuple(Segment(seq_id=docs[i], start=0, end=lengths[docs[i]]) for i in bucket)
            sid = first_slice_id + len(out.slices)
            out.slices.append(Slice(slice_id=sid, segments=segs))
            unit_slices[u].append(sid)
            atoms.append((sid, u))
    for u in range(n_units):
        if unit_slices[u]:
            out.forward_units.append(Unit(slice_ids=tuple(unit_slices[u])))
    if not asymmetric:
        for u in reversed(range(n_units)):
            if unit_slices[u]:
                out.backward_units.append(Unit(slice_ids=tuple(reversed(unit_slices[u]))))
        return
    # -- backward: mirrored long segments, atoms re-dealt LPT on backward cost ---------------
    back: list[list[int]] = [
        [segment_slice[(s.seq_id, s.start)] for s in sorted(mirrored[b], key=lambda s: -s.start)]
        for b in range(n_units)
    ]
    heap = [(load, b) for b, load in enumerate(bwd_load)]
    heapq.heapify(heap)
    atom_cost = {sid: sum(est.backward(seg.num_tokens) for seg in out.slices[sid - first_slice_id].segments)
                 for sid, _ in atoms}
    for sid, _ in sorted(atoms, key=lambda a: -atom_cost[a[0]]):
        load, b = heapq.heappop(heap)
        back[b].append(sid)
        heapq.heappush(heap, (load + atom_cost[sid], b))
    for b in range(n_units):
        if back[b]:
            out.backward_units.append(Unit(slice_ids=tuple(back[b])))


def _cap_length(cuts: list[int], limit: int) -> list[int]:
    """Split any segment longer than ``limit`` tokens (cost balancing makes early ones long)."""
    capped = [cuts[0]]
    for start, end in zip(cuts, cuts[1:], strict=False):
        pieces = math.ceil((end - start) / limit)
        for i in range(1, pieces):
            capped.append(start + i * limit)
        capped.append(end)
    return capped


def _lightest_window(loads: list[float], width: int) -> int:
    """Start of the ``width`` consecutive units with the least load so far."""
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
