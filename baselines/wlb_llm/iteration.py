"""One WLB-LLM packing iteration, without the IR: queues, packer, DP assignment, delays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from baselines.wlb_llm.outlier_queue import OutlierQueues, admit_and_release
from baselines.wlb_llm.packer import wlb_pack
from baselines.wlb_llm.workload import Workload

Doc = tuple[int, int]
"""(seq_id, length)."""


@dataclass(frozen=True, kw_only=True)
class IterationPacking:
    microbatches: list[list[Doc]]
    """All dp*M micro-batches of this iteration, replica r holding ``r::dp`` positions."""
    carried: list[Doc]
    """Documents the packer could not fit: they go to the next iteration."""
    queues: OutlierQueues
    delay_token_iterations: float
    """Sum over trained tokens of (this iteration - arrival iteration)."""
    trained_tokens: int


def pack_iteration(docs: Sequence[Doc], *, num_microbatches: int, s_max: int,
                   workload: Workload, queues: OutlierQueues, iteration: int,
                   arrivals: dict[int, int] | None = None, steady_state: bool = False,
                   ) -> IterationPacking:
    """Pack one iteration's documents into ``num_microbatches`` micro-batches.

    ``steady_state``: instead of holding this batch's outliers back, place them one per
    micro-batch as a queue release would (what the queues achieve on average once they run
    full), so a single batch is planned completely; used for one-shot comparisons.
    ``arrivals`` gives the arrival iteration of carried-over documents (default: now).
    """
    arrivals = arrivals or {}
    if steady_state:
        state = queues
        keep, released_docs = _release_steady_state(docs, queues.thresholds, num_microbatches)
        held_arrival = {}
    else:
        state, keep, held = admit_and_release(queues, docs, iteration, num_microbatches)
        released_docs = [[(h.seq_id, h.length) for h in level] for level in held]
        held_arrival = {h.seq_id: h.arrived for level in held for h in level}
    pool: list[Doc] = list(keep)
    preplaced = _place_released(released_docs, pool, num_microbatches, s_max)
    lengths = [n for _, n in pool]
    result = wlb_pack(lengths, num_microbatches, s_max, workload, preplaced=preplaced)
    microbatches = [[pool[i] for i in mb] for mb in result.microbatches]
    delay = 0.0
    trained = 0
    if held_arrival or arrivals:
        for mb in microbatches:
            for seq_id, n in mb:
                arrived = held_arrival.get(seq_id, arrivals.get(seq_id, iteration))
                delay += (iteration - arrived) * n
                trained += n
    else:  # every document arrived this iteration: no delay
        trained = sum(n for mb in microbatches for _, n in mb)
    return IterationPacking(microbatches=microbatches,
                            carried=[pool[i] for i in result.carried], queues=state,
                            delay_token_iterations=delay, trained_tokens=trained)


def _release_steady_state(docs: Sequence[Doc], thresholds: tuple[int, ...],
                          num_microbatches: int) -> tuple[list[Doc], list[list[Doc]]]:
    """(documents to pack, released documents per queue): each queue releases the first
    ``num_microbatches`` of the documents at its level, in batch order (a document's level is
    the highest threshold it reaches, :meth:`OutlierQueues.level`)."""
    lengths = np.fromiter((n for _, n in docs), dtype=np.int64, count=len(docs))
    levels = np.searchsorted(np.asarray(thresholds, dtype=np.int64), lengths, side="right") - 1
    released_at: list[np.ndarray] = [np.flatnonzero(levels == k)[:num_microbatches]
                                     for k in range(len(thresholds))]
    kept = np.ones(len(docs), dtype=bool)
    for positions in released_at:
        kept[positions] = False
    return ([docs[i] for i in np.flatnonzero(kept).tolist()],
            [[docs[i] for i in positions.tolist()] for positions in released_at])


def _place_released(released: list[list[Doc]], pool: list[Doc], num_microbatches: int,
                    s_max: int) -> list[list[int]]:
    """One released outlier of each queue per micro-batch, longest first, each to the
    micro-batch with the fewest tokens that has none of its queue yet and room under S_max;
    an outlier that finds no room is packed like any other document. Appends to ``pool``."""
    preplaced: list[list[int]] = [[] for _ in range(num_microbatches)]
    tokens = [0] * num_microbatches
    has_level: list[set[int]] = [set() for _ in range(num_microbatches)]
    items = sorted(((d, lvl) for lvl, docs in enumerate(released) for d in docs),
                   key=lambda x: (-x[0][1], x[0][0]))
    for d, lvl in items:
        ok = [m for m in range(num_microbatches)
              if lvl not in has_level[m] and tokens[m] + d[1] <= s_max]
        if not ok:
            ok = [m for m in range(num_microbatches) if tokens[m] + d[1] <= s_max]
        pool.append(d)
        if ok:
            m = min(ok, key=lambda m: (tokens[m], m))
            preplaced[m].append(len(pool) - 1)
            tokens[m] += d[1]
            has_level[m].add(lvl)
    return preplaced


def assign_to_replicas(microbatches: list[list[Doc]], workloads: list[float], dp: int,
                       ) -> list[list[list[Doc]]]:
    """Equal micro-batch counts per replica, balanced by workload: heaviest first, snake
    order over replicas (LPT with a count constraint)."""
    order = sorted(range(len(microbatches)), key=lambda m: (-workloads[m], m))
    replicas: list[list[list[Doc]]] = [[] for _ in range(dp)]
    for k, m in enumerate(order):
        lap, pos = divmod(k, dp)
        replicas[pos if lap % 2 == 0 else dp - 1 - pos].append(microbatches[m])
    return replicas
