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
   MicroPack of that round, in order. Two sequences share MicroPacks only where the lighter
   window of the round is at most half a MicroPack's target and every MicroPack keeps to S
   tokens of long work (memory is sized on S per MicroPack).
3. **Global fill.** The replica needs about ``total forward / target`` MicroPacks; those not
   taken by long segments form filler rounds. Short documents are then dealt, heaviest first,
   to the lightest MicroPack of *any* round (LPT) while its round has token room, so every
   step ends at about the same forward time.
4. **Backward MicroPacks** (:mod:`.backward`). A long sequence gets a second set of cuts,
   balanced on *backward* cost, and is held in sub-slices between the union of its forward
   and backward cuts; backward segment j runs in the backward step that mirrors forward
   segment j's (forward step u -> backward step n-1-u), which gives the reverse-order rule.
   Each step's short documents are held in a few *atom slices*, dealt again, LPT on backward
   cost, over the round's backward steps (with ``round_warmup`` the first backward step takes
   one atom of the last forward step: the schedule sizes its warm-up from it). Attention's
   backward/forward ratio grows with the KV prefix (marginal cost of a 2K slice of llama-7b
   in the kernel model: 1.3 at prefix 0, 2.2 at prefix 254K), so forward-balanced steps are
   not backward-balanced; the regrouping fixes that without recompute, because every slice
   has its own autograd graph.
   ``short_reserve`` keeps a share of long rounds for short documents.

With ``asymmetric=False`` the backward MicroPacks are the forward ones in reverse order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate

from slimpack.plan import Segment, Slice, Unit
from slimpack.planning.deadline import Deadline
from slimpack.slimpack_planner import backward
from slimpack.slimpack_planner.estimate import WorkEstimator, first_tile_reaching

TILE = 128
MIN_TOKENS_PER_CP_RANK = 512
"""Shortest slice per CP rank: each rank then holds two zigzag chunks of at least 256 tokens
(two 128-token attention tiles), so tile waste stays small; cost-balanced cuts otherwise
shrink late slices of a long sequence below one tile per rank at cp 8."""
ATOMS_PER_UNIT = 4
"""Short documents of one forward MicroPack are held in this many atom slices, the granularity
at which backward MicroPacks may regroup them (more atoms: finer balance, more slices)."""


class OutOfTime(Exception):
    """A candidate's build passed the planner's deadline (caught by the search, never seen
    by callers)."""


def check(deadline: Deadline | None) -> None:
    if deadline is not None and deadline.expired:
        raise OutOfTime


@dataclass(kw_only=True)
class ReplicaPacks:
    slices: list[Slice] = field(default_factory=list)
    forward_units: list[Unit] = field(default_factory=list)
    backward_units: list[Unit] = field(default_factory=list)
    whole_segments: dict[int, Segment] = field(default_factory=dict, repr=False)
    """seq_id -> the Segment of a whole short document: built once per plan and shared by
    every packing of it (memory repairs, other candidates), not once per packing."""

    def whole(self, seq_id: int, length: int) -> Segment:
        seg = self.whole_segments.get(seq_id)
        if seg is None:
            seg = self.whole_segments[seq_id] = Segment(seq_id=seq_id, start=0, end=length)
        return seg


@dataclass(kw_only=True)
class _Round:
    capacity: int
    tokens: int = 0
    long_segments: list[list[Segment]] = field(default_factory=list)
    """Per MicroPack of this round: its long-sequence segments."""
    short_docs: list[list[int]] = field(default_factory=list)
    """Per MicroPack: seq_ids of whole short documents."""
    unit_tokens: list[int] = field(default_factory=list)

    def add_units(self, count: int) -> None:
        self.long_segments.extend([] for _ in range(count))
        self.short_docs.extend([] for _ in range(count))

    @property
    def num_units(self) -> int:
        return len(self.long_segments)


@dataclass(kw_only=True)
class ReplicaLayout:
    """A replica's rounds in run order, before any slice is built (:func:`layout_replica`)."""

    rounds: list[_Round]
    lengths: dict[int, int]
    short_ids: dict[int, int]
    min_tokens: int

    def unit_tokens(self) -> list[list[int]]:
        """Per round, in run order: the tokens of each MicroPack that holds any (emission
        drops empty ones)."""
        return [[t for t in rnd.unit_tokens if t] for rnd in self.rounds]

    def holds_long(self) -> list[list[bool]]:
        """Per round, aligned with :meth:`unit_tokens`: whether the MicroPack holds a segment
        of a long sequence."""
        return [[bool(segs) for segs, t in zip(rnd.long_segments, rnd.unit_tokens, strict=True)
                 if t] for rnd in self.rounds]

    def long_spans(self) -> list[tuple[int, int, int]]:
        """(tokens, first, last) of each sequence cut over several MicroPacks: its tokens and
        the positions, among the layout's non-empty MicroPacks, of its first and last one."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        held: dict[int, int] = {}
        base = 0
        for rnd in self.rounds:
            filled = rnd.unit_tokens
            # Place of each MicroPack among the non-empty ones (those with long work are).
            places = (range(base, base + len(filled)) if all(filled)
                      else list(accumulate((1 if t else 0 for t in filled), initial=base)))
            for u, segs in enumerate(rnd.long_segments):
                if not segs:
                    continue
                place = places[u]
                for seg in segs:
                    seq = seg.seq_id
                    if seq in first:
                        last[seq] = place
                        held[seq] += seg.end - seg.start
                    else:
                        first[seq] = last[seq] = place
                        held[seq] = seg.end - seg.start
            base += sum(1 for t in filled if t)
        return [(held[s], f, last[s]) for s, f in first.items() if last[s] != f]


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
        x = first_tile_reaching(est.forward, target, cuts[-1] // align + 1,
                                length // align, align) * align
        if x >= length:
            break
        cuts.append(x)
    cuts.append(length)
    return cuts


def slice_sequence(length: int, est: WorkEstimator, *, slice_tokens: int, target: float,
                   deadline: Deadline | None = None, min_tokens: int = TILE) -> list[int]:
    """Cuts of one long sequence: equal forward cost, each segment at most ``slice_tokens``.

    Enough pieces that none exceeds a MicroPack's forward budget; more while the first
    (longest, cheapest-per-token) segment is longer than S. Segments of equal cost shrink
    along the sequence, so the first is the longest and costs F(L)/k: it fits S from about
    k = F(L)/F(S) pieces on, where the search starts; it then doubles its step until the
    cuts fit and bisects back (O(log) cut sets, where raising k one by one took thousands).
    """
    most = max(math.ceil(length / TILE), 1)
    total = est.forward(length)
    pieces = min(max(math.ceil(length / slice_tokens), math.ceil(total / target),
                     math.ceil(total / est.forward(slice_tokens)), 1), most)

    def fits(k: int) -> list[int] | None:
        check(deadline)
        cuts = cost_balanced_cuts(length, k, est)
        ok = max(b - a for a, b in zip(cuts[:-1], cuts[1:], strict=True)) <= slice_tokens
        return cuts if ok or k >= most else None

    cuts = fits(pieces)
    if cuts is not None:
        return _merge_thin_tail(cuts, min_tokens)
    lo, step = pieces, 1  # lo fails
    while True:
        hi = min(lo + step, most)
        cuts = fits(hi)
        if cuts is not None:
            break
        lo, step = hi, step * 2
    while hi - lo > 1:  # fits(hi) holds, fits(lo) fails
        mid = (lo + hi) // 2
        found = fits(mid)
        if found is not None:
            hi, cuts = mid, found
        else:
            lo = mid
    return _merge_thin_tail(cuts, min_tokens)


def _merge_thin_tail(cuts: list[int], min_tokens: int) -> list[int]:
    """Equal-cost segments shrink along the sequence: walking back from its end, join
    consecutive segments until each holds at least ``min_tokens`` (a short remainder at
    the front joins its neighbour)."""
    if min_tokens <= TILE or len(cuts) <= 2:
        return cuts
    kept = [cuts[-1]]
    for c in reversed(cuts[1:-1]):
        if kept[-1] - c >= min_tokens:
            kept.append(c)
    if len(kept) > 1 and kept[-1] < min_tokens:
        kept.pop()
    return [0, *reversed(kept)]


def _long_rounds(lengths: dict[int, int], cuts_of: dict[int, list[int]], token_capacity: int,
                 unit_capacity: float) -> list[list[int]]:
    """First-fit decreasing of long sequences into rounds bounded in tokens and MicroPacks.

    A round without room for the shortest long sequence, or for one more MicroPack, can
    take nothing more: it leaves the scan (first fit over the rest is first fit over all),
    which keeps the scan short when thousands of sequences fill hundreds of rounds."""
    rounds: list[list[int]] = []
    room: list[tuple[int, float]] = []
    open_rounds: list[int] = []  # rounds that may still take a sequence, in order
    shortest = min(lengths.values(), default=0)
    for seq in sorted(lengths, key=lambda s: (-(len(cuts_of[s]) - 1), -lengths[s], s)):
        n, k = lengths[seq], len(cuts_of[seq]) - 1
        for i, r in enumerate(open_rounds):
            tokens_free, units_free = room[r]
            if n <= tokens_free and k <= units_free:
                rounds[r].append(seq)
                room[r] = (tokens_free - n, units_free - k)
                if tokens_free - n < shortest or units_free - k < 1:
                    del open_rounds[i]
                break
        else:
            rounds.append([seq])
            room.append((max(token_capacity - n, 0), max(unit_capacity - k, 0)))
            if room[-1][0] >= shortest and room[-1][1] >= 1:
                open_rounds.append(len(rounds) - 1)
    return rounds


def pack_replica(lengths: dict[int, int], est: WorkEstimator, *, slice_tokens: int | None,
                 round_capacity: int, unit_forward_target: float, asymmetric: bool,
                 inflight_tokens: int | None = None, warmup_units: int = 0,
                 deadline: Deadline | None = None, cp: int = 1,
                 whole_segments: dict[int, Segment] | None = None,
                 cuts_cache: dict | None = None, short_reserve: float = 0.0,
                 regroup_long: bool = False, round_warmup: bool = False) -> ReplicaPacks:
    """Slices and MicroPacks for one replica's sequences: :func:`layout_replica` (steps 1-3
    of the module docstring), then :func:`emit_layout` (step 4).

    ``slice_tokens`` None disables slicing (every sequence stays whole and is a "short"
    document); ``unit_forward_target`` is the forward seconds one MicroPack should take (the
    same across replicas, so every pipeline step is about equally long).

    Memory: the schedule keeps the first (largest) round's MicroPacks plus ``warmup_units``
    in flight for the whole step, so with ``inflight_tokens`` given, every MicroPack is capped
    at ``inflight_tokens / (largest round + warmup_units)`` tokens. ``whole_segments`` caches
    the whole-document segments across calls (see :class:`ReplicaPacks`), ``cuts_cache``
    the cuts of long sequences (read only: one list may serve several sequences).

    ``short_reserve`` (asymmetric only): the share of a long-sequence round's tokens and of its
    MicroPacks' forward target that long work leaves to short documents, so backward
    MicroPacks have short atoms to re-deal where the long work is. ``regroup_long``
    (asymmetric only): backward MicroPacks regroup long-sequence sub-slices too (backward.py);
    ``round_warmup``: a round's first backward MicroPack needs its last forward one.
    """
    layout = layout_replica(lengths, est, slice_tokens=slice_tokens,
                            round_capacity=round_capacity, unit_forward_target=unit_forward_target,
                            asymmetric=asymmetric, inflight_tokens=inflight_tokens,
                            warmup_units=warmup_units, deadline=deadline, cp=cp,
                            cuts_cache=cuts_cache, short_reserve=short_reserve)
    return emit_layout(layout, est, asymmetric=asymmetric, deadline=deadline,
                       whole_segments=whole_segments, regroup_long=regroup_long,
                       round_warmup=round_warmup)


def layout_replica(lengths: dict[int, int], est: WorkEstimator, *, slice_tokens: int | None,
                   round_capacity: int, unit_forward_target: float, asymmetric: bool,
                   inflight_tokens: int | None = None, warmup_units: int = 0,
                   deadline: Deadline | None = None, cp: int = 1,
                   cuts_cache: dict | None = None, short_reserve: float = 0.0,
                   doc_forward: Mapping[int, float] | None = None) -> ReplicaLayout:
    """Steps 1-3 for one replica's sequences: its rounds in run order, each MicroPack's long
    segments and short documents chosen (options as in :func:`pack_replica`), no slice built.
    A memory check can read the layout's tokens per MicroPack (:meth:`ReplicaLayout.unit_tokens`)
    before any slice exists. ``doc_forward``: ``est.forward(length)`` of (at least) these
    sequences when the caller has them.
    """
    target = unit_forward_target
    keep = 1.0 - short_reserve if asymmetric else 1.0
    long_limit = slice_tokens if slice_tokens is not None else math.inf
    long_ids = {s: n for s, n in lengths.items() if n > long_limit}
    short_ids = {s: n for s, n in lengths.items() if n <= long_limit}

    # 1-2. Rounds of long sequences, sliced on cost, one segment per MicroPack in order.
    # A round may hold as many MicroPacks as fit in flight at S tokens each beside the warm-up.
    unit_budget = math.inf
    if inflight_tokens is not None and slice_tokens is not None:
        unit_budget = max(inflight_tokens // slice_tokens - warmup_units, 1)
    min_tokens = MIN_TOKENS_PER_CP_RANK * cp if cp > 1 else TILE
    # A memory repair packs the same sequences again with smaller rounds: their cuts do not
    # depend on the rounds, so they are kept (keyed by everything they depend on).
    cuts_cache = cuts_cache if cuts_cache is not None else {}
    cuts_of: dict[int, list[int]] = {}
    for seq, n in long_ids.items():
        key = (n, slice_tokens, target * keep, min_tokens, id(est))
        cuts = cuts_cache.get(key)
        if cuts is None:
            cuts = cuts_cache[key] = slice_sequence(n, est, slice_tokens=slice_tokens,
                                                    target=target * keep, deadline=deadline,
                                                    min_tokens=min_tokens)
        cuts_of[seq] = cuts
    # Every long segment is priced below (forward loads here, backward in emit_round): price
    # them all in one batched pass rather than one cost-model call each.
    est.prefetch_segments((b - a, a) for cuts in cuts_of.values()
                          for a, b in zip(cuts[1:-1], cuts[2:], strict=True))
    members_of = (_long_rounds(long_ids, cuts_of, int(round_capacity * keep), unit_budget)
                  if long_ids else [])
    rounds: list[_Round] = []
    fwd_load: list[list[float]] = []
    for members in members_of:
        rnd = _Round(capacity=max(round_capacity, sum(long_ids[s] for s in members)))
        loads: list[float] = []
        held: list[int] = []  # long tokens per MicroPack
        for seq_id in members:
            cuts = cuts_of[seq_id]
            k = len(cuts) - 1
            offset = _lightest_window(loads, k) if k <= len(loads) else 0
            window = loads[offset:offset + k]
            if (len(window) < k or max(window, default=0.0) > 0.5 * target
                    or any(held[offset + j] + cuts[j + 1] - cuts[j] > long_limit
                           for j in range(k))):
                # No room beside the round's other long sequences: its own MicroPacks, after
                # theirs (stacking segments of two sequences in one step doubles its time,
                # and a step of more than S tokens of them would hold more than memory was
                # sized for: the per-MicroPack token cap below assumes S).
                offset = len(loads)
                rnd.add_units(k)
                loads.extend([0.0] * k)
                held.extend([0] * k)
            for j in range(k):
                seg = Segment(seq_id=seq_id, start=cuts[j], end=cuts[j + 1])
                rnd.long_segments[offset + j].append(seg)
                loads[offset + j] += est.forward(seg.num_tokens, seg.start)
                held[offset + j] += seg.end - seg.start
            rnd.tokens += long_ids[seq_id]
        rounds.append(rnd)
        fwd_load.append(loads)

    # Rounds beyond the unit budget ("giant": a sequence so costly it needs more MicroPacks
    # than fit in flight at S tokens each) run last, so the warm-up is sized by the others.
    giant_limit = unit_budget
    largest = max((r.num_units for r in rounds if r.num_units <= giant_limit), default=0)
    if inflight_tokens is None:
        unit_cap = math.inf
    elif largest:
        unit_cap = max(inflight_tokens // (largest + warmup_units), 1)
    else:  # short documents (or giants) only: rounds of S-token MicroPacks beside the warm-up
        unit_cap = max(slice_tokens or max(short_ids.values(), default=1), 1)
        largest = max(1, inflight_tokens // unit_cap - warmup_units)
    for rnd in rounds:
        rnd.unit_tokens = [sum(seg.num_tokens for seg in segs) for segs in rnd.long_segments]

    # 3. Filler rounds for the MicroPacks short documents need beyond the long rounds'.
    # Water level: every step should end near ``level``; long rounds absorb short work up to
    # it (as far as their token room allows) and the rest needs steps of its own.
    short_fwd = (est.documents_forward(short_ids) if doc_forward is None
                 else {s: doc_forward[s] for s in short_ids})
    short_work = sum(short_fwd.values())
    total = sum(sum(loads) for loads in fwd_load) + short_work
    wanted = max(1, round(total / target)) if target > 0 else 1
    if slice_tokens is None:
        wanted = min(wanted, len(lengths))
    level = total / wanted
    per_token = short_work / max(sum(short_ids.values()), 1)
    absorb = sum(min(sum(max(level - x, 0.0) for x in loads),
                     max(rnd.capacity - rnd.tokens, 0) * per_token)
                 for rnd, loads in zip(rounds, fwd_load, strict=True))
    spare = round(max(short_work - absorb, 0.0) / level) if level > 0 else 0
    # Filler rounds as large as the largest long round (never more steps in flight than the
    # warm-up already holds), so round boundaries cost no pipeline stall.
    per_round = max(1, largest) if largest else max(1, spare)

    def add_filler_round() -> None:
        rnd = _Round(capacity=round_capacity)
        rnd.add_units(per_round)
        rnd.unit_tokens = [0] * per_round
        rounds.append(rnd)
        fwd_load.append([0.0] * per_round)

    if short_ids and (spare > 0 or not rounds):
        for _ in range(max(1, math.ceil(spare / per_round))):
            add_filler_round()
    _fill_short_documents(rounds, fwd_load, short_ids, short_fwd, unit_cap=unit_cap,
                          add_round=add_filler_round)

    # 4. (emit_layout) Slices and the two partitions, round by round, most MicroPacks
    # first. The schedule keeps the first round's MicroPacks plus the 2(p-1) warm-up in flight
    # for the whole step; were a later round larger, its first backward would wait for all of
    # its forwards and the pipeline would drain at the boundary (the per-step token cap above
    # pays for this order). Giants go last, in ascending order: each costs one such drain, but
    # none inflates the warm-up of the whole step.
    normal = sorted((r for r in rounds if r.num_units <= giant_limit), key=lambda r: -r.num_units)
    giants = sorted((r for r in rounds if r.num_units > giant_limit), key=lambda r: r.num_units)
    return ReplicaLayout(rounds=normal + giants, lengths=lengths, short_ids=short_ids,
                         min_tokens=min_tokens)


def emit_layout(layout: ReplicaLayout, est: WorkEstimator, *, asymmetric: bool,
                deadline: Deadline | None = None,
                whole_segments: dict[int, Segment] | None = None,
                regroup_long: bool = False, round_warmup: bool = False,
                doc_backward: Mapping[int, float] | None = None) -> ReplicaPacks:
    """The slices and forward and backward MicroPacks of a layout, round by round in its
    order (options as in :func:`pack_replica`; ``doc_backward``: ``est.backward(length)`` of
    its short documents when the caller has them)."""
    out = ReplicaPacks(whole_segments=whole_segments if whole_segments is not None else {})
    short_bwd = (est.documents_backward(layout.short_ids) if doc_backward is None
                 else doc_backward)
    for rnd in layout.rounds:
        check(deadline)
        _emit_round(rnd, layout.lengths, short_bwd, est, asymmetric, out,
                    min_tokens=layout.min_tokens, regroup_long=regroup_long,
                    round_warmup=round_warmup)
    return out


def _fill_short_documents(rounds: list[_Round], fwd_load: list[list[float]],
                          short_ids: dict[int, int], short_fwd: dict[int, float], *,
                          unit_cap: float, add_round) -> None:
    """LPT: heaviest document first, into the lightest MicroPack with room (its round's token
    capacity and the per-MicroPack token cap); a new filler round when none has room.

    Every open MicroPack sits in one heap keyed ``(load, round, position)``, so its top is
    the lightest, ties by round then position. A MicroPack without room for the current
    document is *parked* in a max-heap keyed by its room, and so is a round without room
    (its MicroPacks are set aside as they reach the top). Parked rooms do not change (nothing
    is added to a parked round or MicroPack) and documents come longest first, so a parked
    item is reopened once the documents have shrunk to its room, and never looked at before
    that; a reopened item has room for every later document, so it is parked again only
    after it took one: O((docs + MicroPacks) log) in all, where cycling full MicroPacks
    through the heap cost O(docs x MicroPacks). The choice is the same as that exhaustive
    scan's (``tests/test_solver.py`` compares them).
    """
    # Per round, its fields as plain lists (the loop reads them ~10^5 times; attribute
    # lookups were a good part of it): tokens are written back at the end.
    tokens: list[int] = []
    capacity: list[int] = []
    unit_tokens: list[list[int]] = []
    docs_of: list[list[list[int]]] = []
    round_parked: list[bool] = []
    set_aside: list[list[tuple[float, int, int]]] = []  # per round: entries while it is parked
    parked_rounds: list[tuple[int, int]] = []  # (-room, round)
    parked_units: list[tuple[int, int, int]] = []  # (-room, round, position)

    def open_round(r: int) -> list[tuple[float, int, int]]:
        rnd = rounds[r]
        tokens.append(rnd.tokens)
        capacity.append(rnd.capacity)
        unit_tokens.append(rnd.unit_tokens)
        docs_of.append(rnd.short_docs)
        round_parked.append(False)
        set_aside.append([])
        return [(load, r, u) for u, load in enumerate(fwd_load[r])]

    heap = [entry for r in range(len(rounds)) for entry in open_round(r)]
    heapq.heapify(heap)
    # The loop peeks at the top entry and replaces it (heapreplace) instead of popping and
    # pushing: every key is unique (round, position), so the choices are the same.
    heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
    # Longest first, ties by seq_id: (-length, seq_id) pairs compare in C, no key function.
    for neg_n, seq_id in sorted([(-n, s) for s, n in short_ids.items()]):
        n = -neg_n
        # Reopen what the shorter document now fits.
        while parked_rounds and -parked_rounds[0][0] >= n:
            _, r = heappop(parked_rounds)
            round_parked[r] = False
            for entry in set_aside[r]:
                heappush(heap, entry)
            set_aside[r] = []
        while parked_units and -parked_units[0][0] >= n:
            _, r, u = heappop(parked_units)
            entry = (fwd_load[r][u], r, u)
            if round_parked[r]:
                set_aside[r].append(entry)
            else:
                heappush(heap, entry)
        while True:
            force = not heap
            if force:  # nothing has room: a new filler round takes it, fitting or not
                add_round()
                for entry in open_round(len(rounds) - 1):
                    heappush(heap, entry)
            entry = heap[0]
            load, r, u = entry
            if round_parked[r]:
                set_aside[r].append(heappop(heap))
                continue
            held = tokens[r]
            if held + n > capacity[r] and not force:
                set_aside[r].append(heappop(heap))
                round_parked[r] = True
                if held < capacity[r]:  # a full round never reopens
                    heappush(parked_rounds, (held - capacity[r], r))
                continue
            used = unit_tokens[r][u]
            if used and used + n > unit_cap and not force:
                # This MicroPack is full for this document; its round's others still compete.
                heappop(heap)
                heappush(parked_units, (used - unit_cap, r, u))
                continue
            docs_of[r][u].append(seq_id)
            tokens[r] = held + n
            unit_tokens[r][u] = used + n
            load = fwd_load[r][u] = load + short_fwd[seq_id]
            heapreplace(heap, (load, r, u))
            break
    for rnd, held in zip(rounds, tokens, strict=True):
        rnd.tokens = held


def _emit_round(rnd: _Round, lengths: dict[int, int], short_bwd: dict[int, float],
                est: WorkEstimator, asymmetric: bool, out: ReplicaPacks, *,
                min_tokens: int = TILE, regroup_long: bool = False,
                round_warmup: bool = False) -> None:
    """Slices and MicroPacks of one round; ``short_bwd``: seq_id -> backward seconds of each
    short document (``est.backward(length)``)."""
    n_units = rnd.num_units
    new_slice = _slice_maker(out)
    atoms_of = _atom_maker(rnd, lengths, short_bwd, out)

    if asymmetric:
        # Long segments regrouped on backward cost, short atoms re-dealt (backward.py).
        fwd, bwd = backward.emit_round(
            rnd.long_segments, [atoms_of(u, ATOMS_PER_UNIT) for u in range(n_units)], est,
            new_slice, min_tokens=min_tokens, regroup_long=regroup_long,
            round_warmup=round_warmup)
        out.forward_units.extend(Unit(slice_ids=tuple(f)) for f in fwd if f)
        out.backward_units.extend(Unit(slice_ids=tuple(b)) for b in bwd if b)
        return
    unit_slices: list[list[int]] = [[] for _ in range(n_units)]
    for u in range(n_units):
        for seg in rnd.long_segments[u]:
            unit_slices[u].append(new_slice((seg,)))
        for segs, _ in atoms_of(u, 1):
            unit_slices[u].append(new_slice(segs))
    for u in range(n_units):
        if unit_slices[u]:
            out.forward_units.append(Unit(slice_ids=tuple(unit_slices[u])))
    for u in reversed(range(n_units)):
        if unit_slices[u]:
            out.backward_units.append(Unit(slice_ids=tuple(reversed(unit_slices[u]))))


def _atom_maker(rnd: _Round, lengths: dict[int, int], short_bwd: dict[int, float],
                out: ReplicaPacks):
    """``atoms_of(u, count)``: forward MicroPack u's short documents in ``count`` slices
    balanced on backward cost, each with its backward cost (summed in its documents' order)."""
    known = out.whole_segments
    whole = out.whole

    def atoms_of(u: int, count: int) -> list[tuple[tuple[Segment, ...], float]]:
        # The fill deals documents longest first (ties by seq_id), so a MicroPack's list is
        # already in the order a stable sort by length would give: no sort needed.
        docs = rnd.short_docs[u]
        if not docs:
            return []
        bwd = [short_bwd[s] for s in docs]
        if len(docs) <= count:
            # One document per atom, heaviest first: what lpt_buckets gives (and 0 + cost
            # is cost), without its buckets.
            order = sorted(range(len(docs)), key=bwd.__getitem__, reverse=True)
            return [((known.get(docs[i]) or whole(docs[i], lengths[docs[i]]),), bwd[i])
                    for i in order]
        atoms = []
        for bucket in lpt_buckets(bwd, count):
            if bucket:
                cost = 0
                for i in bucket:
                    cost += bwd[i]
                segs = tuple([known.get(docs[i]) or whole(docs[i], lengths[docs[i]])
                              for i in bucket])
                atoms.append((segs, cost))
        return atoms

    return atoms_of


def _slice_maker(out: ReplicaPacks):
    """``new_slice(segments)``: appends a slice to ``out`` and returns its id (a closure over
    the list: emission makes one per segment or atom, ~10^5 per plan)."""
    slices = out.slices
    append = slices.append

    def new_slice(segments: tuple[Segment, ...]) -> int:
        sid = len(slices)
        append(Slice(slice_id=sid, segments=segments))
        return sid

    return new_slice


def _lightest_window(loads: list[float], width: int) -> int:
    """Start of the ``width`` consecutive MicroPacks with the least load so far."""
    n = len(loads)
    if width >= n:
        return 0
    return min(range(n - width + 1), key=lambda o: sum(loads[o:o + width]))


def lpt_buckets(weights: list[float], num_buckets: int) -> list[list[int]]:
    """Indices of ``weights`` split into ``num_buckets`` buckets of balanced total weight."""
    num_buckets = max(1, min(num_buckets, len(weights)))
    if num_buckets == 1:
        return [list(range(len(weights)))]
    # Heaviest first, ties in index order (a stable descending sort keeps them in order).
    order = sorted(range(len(weights)), key=weights.__getitem__, reverse=True)
    if num_buckets == len(weights):
        # One item per bucket: the heap below would pop the empty buckets 0, 1, ... in turn.
        return [[i] for i in order]
    heap = [(0.0, b) for b in range(num_buckets)]
    buckets: list[list[int]] = [[] for _ in range(num_buckets)]
    for i in order:
        load, b = heap[0]  # (load, bucket) keys are unique: replace = pop + push
        buckets[b].append(i)
        heapq.heapreplace(heap, (load + weights[i], b))
    return buckets
