"""WLB-LLM's heuristic variable-length packer (arXiv 2503.17924, section 4.1, Algorithm 1).

Minimise the largest micro-batch workload under the token cap ``S_max``: documents longest
first; each goes to the micro-batch with the least workload; if it does not fit there (tokens
> S_max), to the micro-batch with the fewest tokens; if it fits nowhere, it is carried to the
next iteration. Micro-batches may start with pre-placed documents (released outliers).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PackResult:
    microbatches: list[list[int]]
    """Indices into the input documents per micro-batch (pre-placed ones first)."""
    carried: list[int]
    """Documents that fit nowhere this iteration."""
    workloads: list[float]
    tokens: list[int]


def wlb_pack(lengths: Sequence[int], num_microbatches: int, s_max: int,
             workload: Callable[[int], float], *,
             preplaced: Sequence[Sequence[int]] = ()) -> PackResult:
    """Pack documents ``lengths`` into ``num_microbatches`` micro-batches of <= ``s_max``
    tokens. ``preplaced[m]`` lists document indices already in micro-batch m (not re-packed)."""
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    if s_max < 1:
        raise ValueError(f"s_max must be >= 1 token, got {s_max}")
    bins: list[list[int]] = [[] for _ in range(num_microbatches)]
    loads = [0.0] * num_microbatches
    tokens = [0] * num_microbatches
    placed = set()
    for m, docs in enumerate(preplaced):
        for i in docs:
            bins[m].append(i)
            loads[m] += workload(lengths[i])
            tokens[m] += lengths[i]
            placed.add(i)
    carried: list[int] = []
    order = sorted((i for i in range(len(lengths)) if i not in placed),
                   key=lambda i: (-lengths[i], i))
    # Two lazy min-heaps give the least-loaded and the fewest-token micro-batch (ties to the
    # lowest index, as a scan would) in O(log M): loads and tokens only grow, so an entry
    # whose value is no longer the bin's is stale and dropped when it surfaces.
    by_load = [(loads[m], m) for m in range(num_microbatches)]
    by_tokens = [(tokens[m], m) for m in range(num_microbatches)]
    heapq.heapify(by_load)
    heapq.heapify(by_tokens)

    def lowest(heap: list[tuple], current: list) -> int:
        while heap[0][0] != current[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][1]

    for i in order:
        n = lengths[i]
        target = lowest(by_load, loads)
        if tokens[target] + n > s_max:
            target = lowest(by_tokens, tokens)
            if tokens[target] + n > s_max:
                carried.append(i)
                continue
        bins[target].append(i)
        loads[target] += workload(n)
        tokens[target] += n
        heapq.heappush(by_load, (loads[target], target))
        heapq.heappush(by_tokens, (tokens[target], target))
    return PackResult(microbatches=bins, carried=carried, workloads=loads, tokens=tokens)
