"""Megatron-Core's hybrid (dynamic) context-parallel scheduler: which data-parallel x context-
parallel ranks run which documents, round by round.

The rules are those of Megatron-Core's ``BalancedCPScheduler``
(NVIDIA/Megatron-LM 00caa53, ``megatron/core/pipeline_parallel/hybrid_cp_schedule.py``,
``get_groups_and_subsamples`` and ``next_hdp_group``), read for its rules and written here
anew; nothing is copied. Megatron-Core runs it at pipeline parallelism 1 only
(``megatron/training/arguments.py``: "Hybrid context parallelism not supported with pipeline
parallelism").

* A document of ``s`` tokens needs ``next_power_of_two(ceil(s / capacity))`` ranks (at least
  one), ``capacity`` being ``max_seqlen_per_dp_cp_rank``; its estimated work is ``s^2 / cp``
  on each of them (attention's share, Megatron-Core's own estimate).
* Documents are taken longest first. A round (Megatron-Core's "group", one barrier each) cuts
  them, in that order, into as many buckets of about equal work as there are distinct CP
  sizes (a bucket closes at 110% of its share, or to leave one document per later bucket).
* The head of the first bucket that can be placed goes to a new group on the lowest free
  ranks while enough ranks are free, else to the least-loaded existing group of exactly its
  size; a round ends when no bucket head can be placed, or, once a document smaller than the
  round's first has been placed, as soon as every rank's work is within 5% of the busiest.
* Then, while the busiest rank is over 5% above the idlest and no rank is idle, the busiest
  group's last document goes back to the leftovers if that narrows the spread.
* Idle ranks are filled by doubling the first smallest group's size (capped at all ranks),
  shifting later groups up, until every rank has work.
* Leftover documents start the next round, in the order they were left.

Every rank of a group runs the group's documents one at a time, each its own forward and
backward, and every group is a set of consecutive ranks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from slimpack.planning import next_power_of_two

BUCKET_SLACK = 0.10
"""A bucket closes when its work would pass its share by this much (``eps_bucket``)."""
BALANCE_SLACK = 0.05
"""A round is balanced when the idlest rank is within this share of the busiest (``delta``)."""

Document = tuple[int, int]
"""(sequence id, tokens)."""


@dataclass(frozen=True, kw_only=True)
class CPGroup:
    """Consecutive data-parallel x context-parallel ranks running ``documents`` in order, each
    document split over all of them."""

    ranks: tuple[int, ...]
    documents: tuple[Document, ...]


def ranks_needed(tokens: int, capacity: int) -> int:
    """CP size of a document: the next power of two of ``ceil(tokens / capacity)``, >= 1."""
    return next_power_of_two(max(1, -(-tokens // capacity)))


def work(tokens: int, capacity: int, cp: int | None = None) -> float:
    """Megatron-Core's estimate of a document's work on each of its ranks: ``tokens^2 / cp``."""
    return tokens * tokens / (cp or ranks_needed(tokens, capacity))


def equal_work_buckets(documents: Sequence[Document], capacity: int) -> list[deque[Document]]:
    """``documents`` in their order, cut into one bucket per distinct CP size of about equal
    work."""
    count = len({ranks_needed(n, capacity) for _, n in documents})
    target = sum(work(n, capacity) for _, n in documents) / count
    buckets: list[deque[Document]] = []
    current: list[Document] = []
    current_work, remaining = 0.0, count
    for i, doc in enumerate(documents):
        w = work(doc[1], capacity)
        # Megatron-Core counts the buckets still to open twice (remaining, minus those
        # opened): kept, as it decides where the buckets close.
        if current and (current_work + w > target * (1 + BUCKET_SLACK)
                        or len(documents) - i <= remaining - len(buckets)):
            buckets.append(deque(current))
            current, current_work = [], 0.0
            remaining -= 1
        current.append(doc)
        current_work += w
    if current:
        buckets.append(deque(current))
    return buckets


def next_round(documents: Sequence[Document], capacity: int,
               num_ranks: int) -> tuple[list[CPGroup], list[Document]]:
    """One round: its groups (every rank in exactly one) and the documents left for later."""
    buckets = equal_work_buckets(documents, capacity)
    loads = [0.0] * num_ranks
    assigned: list[list[Document]] = [[] for _ in range(num_ranks)]
    group_of: list[int | None] = [None] * num_ranks
    members: list[list[int]] = []
    first_size, check_balance = None, False
    while buckets:
        free = [r for r in range(num_ranks) if group_of[r] is None]
        pick = None
        for index, bucket in enumerate(buckets):
            if not bucket:
                continue
            size = ranks_needed(bucket[0][1], capacity)
            if len(free) >= size or any(len(m) == size for m in members):
                pick = index, size
                break
        if pick is None:
            break
        index, size = pick
        doc = buckets[index].popleft()
        same_size = [g for g, m in enumerate(members) if len(m) == size]
        best = min(same_size, key=lambda g: max(loads[r] for r in members[g]), default=None)
        best_load = max(loads[r] for r in members[best]) if best is not None else float("inf")
        if len(free) >= size and loads[free[size - 1]] < best_load:
            best = len(members)
            members.append(free[:size])  # free ranks carry no work: the lowest ones
            for r in free[:size]:
                group_of[r] = best
        for r in members[best]:
            assigned[r].append(doc)
            loads[r] += work(doc[1], capacity)
        while buckets and not buckets[0]:
            buckets.pop(0)
        first_size = first_size or size
        check_balance = check_balance or size < first_size
        if check_balance and buckets and max(loads) - min(loads) <= BALANCE_SLACK * max(loads):
            break
    leftovers = [doc for bucket in buckets for doc in bucket]
    _trim_busiest(loads, assigned, group_of, members, leftovers, capacity)
    return _fill_idle_ranks(assigned, members, num_ranks), leftovers


def _trim_busiest(loads: list[float], assigned: list[list[Document]], group_of: list[int | None],
                  members: list[list[int]], leftovers: list[Document], capacity: int) -> None:
    """Give the busiest group's last document back while that narrows the spread of work."""
    while True:
        busiest, idlest = max(loads), min(loads)
        spread = busiest - idlest
        if spread <= BALANCE_SLACK * busiest or idlest == 0:
            return
        rank = loads.index(busiest)
        if len(assigned[rank]) <= 1:
            return
        group = members[group_of[rank]]
        doc = assigned[rank][-1]
        w = work(doc[1], capacity)
        trimmed = [load - w if r in group else load for r, load in enumerate(loads)]
        if max(trimmed) - min(trimmed) >= spread:
            return
        for r in group:
            assigned[r].pop()
        loads[:] = trimmed
        leftovers.append(doc)


def _fill_idle_ranks(assigned: list[list[Document]], members: list[list[int]],
                     num_ranks: int) -> list[CPGroup]:
    """The round's groups once idle ranks are filled: the first group of the smallest size
    doubles (at most to every rank), the groups after it move up, until no rank is idle.
    Groups hold consecutive ranks from rank 0 (free ranks are taken lowest first), so the idle
    ranks are the last ones."""
    groups = [(m[0], len(m), tuple(assigned[m[0]])) for m in members]
    while (used := sum(size for _, size, _ in groups)) < num_ranks:
        smallest = min(size for _, size, _ in groups)
        grow = min(2 * smallest, num_ranks) - smallest
        if grow > num_ranks - used:
            raise ValueError(f"megatron-dcp: {num_ranks - used} idle ranks cannot grow a "
                             f"group of {smallest} to {smallest + grow} (data-parallel x "
                             f"context-parallel ranks {num_ranks})")
        at = next(i for i, (_, size, _) in enumerate(groups) if size == smallest)
        start, size, docs = groups[at]
        groups[at] = (start, size + grow, docs)
        groups[at + 1:] = [(s + grow, n, d) for s, n, d in groups[at + 1:]]
    return [CPGroup(ranks=tuple(range(start, start + size)), documents=docs)
            for start, size, docs in groups]


def schedule_rounds(documents: Sequence[Document], capacity: int,
                    num_ranks: int) -> list[list[CPGroup]]:
    """Every round of a global batch, longest documents first (Megatron-Core's
    ``get_groups_and_subsamples``). A document needing more than ``num_ranks`` ranks is
    refused: Megatron-Core would never place it."""
    if capacity < 1 or num_ranks < 1:
        raise ValueError(f"megatron-dcp: capacity and ranks must be >= 1, got {capacity}, "
                         f"{num_ranks}")
    too_long = [n for _, n in documents if ranks_needed(n, capacity) > num_ranks]
    if too_long:
        raise ValueError(
            f"megatron-dcp: a {max(too_long)}-token sequence needs "
            f"{ranks_needed(max(too_long), capacity)} ranks at capacity_tokens={capacity}, "
            f"more than the {num_ranks} data-parallel x context-parallel ranks; raise "
            f"capacity_tokens (Megatron-Core's max_seqlen_per_dp_cp_rank) to at least "
            f"{-(-max(too_long) // num_ranks)}")
    pending = sorted(documents, key=lambda d: -d[1])  # stable: ties keep the batch's order
    rounds = []
    while pending:
        groups, pending = next_round(pending, capacity, num_ranks)
        rounds.append(groups)
    return rounds
