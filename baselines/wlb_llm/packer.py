"""WLB-LLM's heuristic variable-length packer (arXiv 2503.17924, section 4.1, Algorithm 1).

Minimise the largest micro-batch workload under the token cap ``S_max``: documents longest
first; each goes to the micro-batch with the least workload; if it does not fit there (tokens
> S_max), to the micro-batch with the fewest tokens; if it fits nowhere, it is carried to the
next iteration. Micro-batches may start with pre-placed documents (released outliers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numba
import numpy as np

from baselines.wlb_llm.workload import Workload


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
    free = np.array([i for i in range(len(lengths)) if i not in placed], dtype=np.int64)
    length_of = np.asarray(lengths, dtype=np.int64).reshape(-1)
    # Longest first, ties to the lower index (a stable sort of the free indices).
    order = free[np.argsort(-length_of[free], kind="stable")]
    ordered = length_of[order]
    weights = (workload.of_lengths(ordered) if isinstance(workload, Workload) else
               np.array([workload(int(n)) for n in ordered.tolist()], dtype=np.float64))
    load_of = np.array(loads, dtype=np.float64)
    token_of = np.array(tokens, dtype=np.int64)
    target = _pack_in_order(ordered, weights, load_of, token_of, int(s_max))
    carried: list[int] = []
    for i, t in zip(order.tolist(), target.tolist(), strict=True):
        if t < 0:
            carried.append(i)
        else:
            bins[t].append(i)
    return PackResult(microbatches=bins, carried=carried, workloads=load_of.tolist(),
                      tokens=token_of.tolist())


@numba.njit(cache=True, nogil=True)
def _pack_in_order(lengths: np.ndarray, weights: np.ndarray, loads: np.ndarray,
                   tokens: np.ndarray, s_max: int):  # noqa: ANN201
    """Algorithm 1's loop over documents already in packing order, compiled: the packer runs
    once per layout a search tries over ~10^5 documents. ``loads``/``tokens`` (per
    micro-batch) are updated in place; returns each document's micro-batch, -1 if carried.

    Two tournament trees give the least-loaded and the fewest-token micro-batch, ties to the
    lowest index (what a scan of Algorithm 1 picks), in O(log M) per document. Loads only
    ever receive ``+= weights[k]``, the same float64 additions in the same order as the loop
    written in Python, so the choices and the loads are the same bits
    (``tests/test_baseline_wlb.py`` checks them against the scan)."""
    num_bins = len(loads)
    leaves = 1
    while leaves < num_bins:
        leaves *= 2
    by_load = np.full(2 * leaves, -1, dtype=np.int64)
    by_tokens = np.full(2 * leaves, -1, dtype=np.int64)
    for m in range(num_bins):
        by_load[leaves + m] = m
        by_tokens[leaves + m] = m
    for node in range(leaves - 1, 0, -1):
        by_load[node] = _lower(loads, by_load[2 * node], by_load[2 * node + 1])
        by_tokens[node] = _lower(tokens, by_tokens[2 * node], by_tokens[2 * node + 1])
    target = np.empty(len(lengths), dtype=np.int64)
    for k in range(len(lengths)):
        n = lengths[k]
        m = by_load[1]
        if tokens[m] + n > s_max:
            m = by_tokens[1]
            if tokens[m] + n > s_max:
                target[k] = -1
                continue
        target[k] = m
        loads[m] += weights[k]
        tokens[m] += n
        node = (leaves + m) // 2
        while node >= 1:
            by_load[node] = _lower(loads, by_load[2 * node], by_load[2 * node + 1])
            by_tokens[node] = _lower(tokens, by_tokens[2 * node], by_tokens[2 * node + 1])
            node //= 2
    return target


@numba.njit(cache=True, nogil=True, inline="always")
def _lower(values: np.ndarray, left: int, right: int) -> int:
    """The micro-batch with the smaller value; ``left`` on a tie (its indices are lower);
    -1 is an empty leaf."""
    if left < 0:
        return right
    if right < 0:
        return left
    return right if values[right] < values[left] else left
