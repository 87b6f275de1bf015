"""Bin-packing and partitioning of sequence lengths (pure functions over integer lengths).

Every function returns lists of *indices* into the input, so callers keep their own ids and
order. Ties are broken by index, so results are deterministic.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence

from slimpack.batch import Batch


def _check_capacity(lengths: Sequence[int], capacity: int) -> None:
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1 token, got {capacity}")
    too_long = [n for n in lengths if n > capacity]
    if too_long:
        raise ValueError(
            f"capacity={capacity} is shorter than {len(too_long)} sequence(s) (longest "
            f"{max(too_long)}); split them first or raise the capacity"
        )


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Pack lengths into bins of ``capacity`` tokens: longest first, into the first bin it fits.

    The classic 11/9 OPT + 6/9 heuristic used by packed SFT pipelines (e.g. the naive packing
    baseline of WLB-LLM, arXiv 2503.17924). O(n log n): "the first bin it fits" is found in a
    tree holding each subtree's largest free room (a paper-size batch has ~65K documents
    and ~500 bins, which a scan of the bins per document makes quadratic).
    """
    return _first_fit(lengths, capacity, sorted(range(len(lengths)),
                                                key=lambda i: (-lengths[i], i)))


def first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Pack lengths into bins of ``capacity`` tokens in their own order, each into the first
    bin it fits. Where the lengths fill bins exactly in order (Megatron-LM's sample pieces,
    :func:`sample_pieces`), the bins are those samples; elsewhere a short document later in
    the batch fills an earlier bin's gap instead of opening a new one."""
    return _first_fit(lengths, capacity, range(len(lengths)))


def _first_fit(lengths: Sequence[int], capacity: int, order: Sequence[int]) -> list[list[int]]:
    """Each index of ``order`` into the first bin with room for its length."""
    _check_capacity(lengths, capacity)
    # First fit never holds two bins at most half full, so it opens fewer than
    # 2 * total / capacity + 1 bins; unopened leaves have the whole capacity free.
    most_bins = min(len(lengths), 2 * -(-sum(lengths) // capacity) + 1)
    size = 1
    while size < most_bins:
        size *= 2
    room = [capacity] * (2 * size)  # room[node]: largest free room below node; leaves at size..
    bins: list[list[int]] = []
    for i in order:
        n = lengths[i]
        node = 1
        while node < size:  # the leftmost leaf with room >= n
            node *= 2
            if room[node] < n:
                node += 1
        b = node - size
        if b == len(bins):
            bins.append([i])
        else:
            bins[b].append(i)
        room[node] -= n
        node //= 2
        while node:
            best = max(room[2 * node], room[2 * node + 1])
            if room[node] == best:
                break  # the ancestors' maxima are unchanged too
            room[node] = best
            node //= 2
    return bins


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Longest first, into the bin with the least room left that still fits (O(n log n))."""
    _check_capacity(lengths, capacity)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    by_room: list[tuple[int, int]] = []  # sorted (free tokens, bin index)
    for i in order:
        n = lengths[i]
        pos = bisect_left(by_room, (n, -1))
        if pos < len(by_room):
            room, b = by_room.pop(pos)
            bins[b].append(i)
            insort(by_room, (room - n, b))
        else:
            bins.append([i])
            insort(by_room, (capacity - n, len(bins) - 1))
    return bins


def concat_and_chunk(lengths: Sequence[int], capacity: int) -> list[list[tuple[int, int, int]]]:
    """Megatron-LM's GPTDataset layout: concatenate documents in order, cut every ``capacity``.

    Returns chunks as lists of ``(index, start, end)`` token ranges of the documents; a document
    crossing a boundary is cut, and with document masks its pieces never attend to each other.
    Only the last chunk may be shorter than ``capacity``.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1 token, got {capacity}")
    chunks: list[list[tuple[int, int, int]]] = [[]]
    room = capacity
    for i, n in enumerate(lengths):
        start = 0
        while start < n:
            if room == 0:
                chunks.append([])
                room = capacity
            take = min(room, n - start)
            chunks[-1].append((i, start, start + take))
            start += take
            room -= take
    return [c for c in chunks if c]


def sample_pieces(batch: Batch, context: int) -> Batch:
    """The batch as Megatron-LM's GPTDataset trains it under document masks: its documents
    concatenated in order and cut every ``context`` tokens (:func:`concat_and_chunk`), each
    piece one sequence of its own (a cut tail never attends to its head). Every method given
    this batch computes the same attention, which the whole documents do not give: Megatron-LM
    and SlimPipe cut them, SlimPack and WLB-LLM keep them. The pieces fill samples exactly, so
    Megatron-LM's own packing of them cuts nothing more. Sequence ids number the pieces in
    order; ``seed`` and ``source`` are the batch's."""
    if context < 1:
        raise ValueError(f"context must be >= 1 token, got {context}")
    lengths = [end - start for chunk in concat_and_chunk(batch.lengths, context)
               for _, start, end in chunk]
    return Batch.from_lengths(lengths, seed=batch.seed, source=batch.source)


def sorted_batching(lengths: Sequence[int], group_size: int, *, seed: int = 0) -> list[list[int]]:
    """LongAlign's sorted batching (arXiv 2401.18058): sort by length, cut into groups of
    ``group_size`` consecutive sequences, shuffle the groups (seeded) so the order of lengths
    across steps is random while each group holds similar lengths."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    import numpy as np

    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups = [order[i:i + group_size] for i in range(0, len(order), group_size)]
    perm = np.random.Generator(np.random.PCG64(seed)).permutation(len(groups))
    return [groups[int(k)] for k in perm]


def lpt_partition(weights: Sequence[float], num_parts: int, *,
                  fits: Callable[[int, int], bool] | None = None) -> list[list[int]]:
    """Longest-processing-time-first: heaviest item to the currently lightest part.

    ``fits(part, item)`` may veto a part (e.g. a memory cap); the item then goes to the lightest
    part that accepts it, or to the lightest part overall if none does (callers check memory).
    Graham's bound: makespan <= (4/3 - 1/(3m)) OPT.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    if fits is None:
        heap = [(0.0, p) for p in range(num_parts)]
        for i in order:
            load, p = heapq.heappop(heap)
            parts[p].append(i)
            heapq.heappush(heap, (load + weights[i], p))
        return parts
    loads = [0.0] * num_parts
    for i in order:
        ranked = sorted(range(num_parts), key=lambda p: (loads[p], p))
        target = next((p for p in ranked if fits(p, i)), ranked[0])
        parts[target].append(i)
        loads[target] += weights[i]
    return parts


def contiguous_partition(weights: Sequence[float], num_parts: int) -> list[list[int]]:
    """Split ``weights`` (in the given order) into ``num_parts`` consecutive runs minimising
    the heaviest run (linear-partition dynamic programme, O(k n log n) via binary search on
    prefix sums). Empty runs appear only when there are fewer items than parts."""
    n = len(weights)
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if n == 0:
        return [[] for _ in range(num_parts)]
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))

    def cuts_for(limit: float) -> list[int] | None:
        # Greedy: extend each run as far as the limit allows; feasible iff <= num_parts runs.
        cuts, start = [], 0
        while start < n:
            end = bisect_left(prefix, prefix[start] + limit + 1e-9, lo=start + 1) - 1
            if end <= start:
                return None
            cuts.append(end)
            start = end
            if len(cuts) > num_parts:
                return None
        return cuts

    lo, hi = max(weights), prefix[-1]
    best = cuts_for(hi)
    for _ in range(60):
        if hi - lo <= 1e-9 * max(hi, 1.0):
            break
        mid = (lo + hi) / 2
        cuts = cuts_for(mid)
        if cuts is None:
            lo = mid
        else:
            hi, best = mid, cuts
    assert best is not None
    runs, start = [], 0
    for end in best:
        runs.append(list(range(start, end)))
        start = end
    # Split the longest runs so every part has something when items allow it.
    while len(runs) < num_parts:
        k = max(range(len(runs)), key=lambda r: len(runs[r]))
        if len(runs[k]) < 2:
            runs.append([])
            continue
        run = runs.pop(k)
        half = len(run) // 2
        runs[k:k] = [run[:half], run[half:]]
    return runs


def next_power_of_two(n: int) -> int:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()
