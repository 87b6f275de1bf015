"""WLB-LLM's multi-level outlier-delay queues (arXiv 2503.17924, section 4.2).

A document at least as long as a queue's threshold is held back in that queue (the highest
threshold it reaches). When a queue holds N documents (N = micro-batches per iteration) it
releases N of them, oldest first, one to each micro-batch, so every micro-batch gets exactly
one outlier of that size class and none is left with two. Held-back tokens are trained late:
the paper reports the delay, and so do we (average iterations per token).

The state is an immutable value passed in and returned, so a caller running many iterations
owns it (no global state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class Held:
    seq_id: int
    length: int
    arrived: int
    """Iteration at which the document arrived."""


@dataclass(frozen=True, kw_only=True)
class OutlierQueues:
    thresholds: tuple[int, ...]
    """Lower length bounds of the queues, increasing."""
    queues: tuple[tuple[Held, ...], ...] = field(default=())

    def __post_init__(self) -> None:
        if list(self.thresholds) != sorted(set(self.thresholds)) or any(
                t < 1 for t in self.thresholds):
            raise ValueError(f"outlier thresholds must be increasing positive token counts, "
                             f"got {self.thresholds}")
        if not self.queues:
            object.__setattr__(self, "queues", tuple(() for _ in self.thresholds))
        if len(self.queues) != len(self.thresholds):
            raise ValueError("one queue per threshold")

    def level(self, length: int) -> int | None:
        """Queue index for a document of ``length`` tokens, or None if it is not an outlier."""
        level = None
        for k, t in enumerate(self.thresholds):
            if length >= t:
                level = k
        return level

    @property
    def num_held(self) -> int:
        return sum(len(q) for q in self.queues)


def admit_and_release(state: OutlierQueues, docs: Sequence[tuple[int, int]], iteration: int,
                      num_microbatches: int,
                      ) -> tuple[OutlierQueues, list[tuple[int, int]], list[list[Held]]]:
    """Queue this iteration's outliers and release full queues.

    Returns ``(new state, documents to pack now, released)`` where ``released[k]`` holds the
    documents queue k releases this iteration (empty, or exactly ``num_microbatches``).
    """
    queues = [list(q) for q in state.queues]
    keep: list[tuple[int, int]] = []
    for seq_id, length in docs:
        level = state.level(length)
        if level is None:
            keep.append((seq_id, length))
        else:
            queues[level].append(Held(seq_id=seq_id, length=length, arrived=iteration))
    released: list[list[Held]] = []
    for k, q in enumerate(queues):
        if len(q) >= num_microbatches:
            released.append(q[:num_microbatches])
            queues[k] = q[num_microbatches:]
        else:
            released.append([])
    new_state = OutlierQueues(thresholds=state.thresholds, queues=tuple(tuple(q) for q in queues))
    return new_state, keep, released


def queues_to_dict(state: OutlierQueues) -> dict:
    """JSON form for ``plan.metadata`` (documents as [seq_id, length, arrived])."""
    return {"thresholds": list(state.thresholds),
            "queues": [[[h.seq_id, h.length, h.arrived] for h in q] for q in state.queues]}


def queues_from_dict(data: dict) -> OutlierQueues:
    return OutlierQueues(
        thresholds=tuple(int(t) for t in data["thresholds"]),
        queues=tuple(tuple(Held(seq_id=int(a), length=int(b), arrived=int(c)) for a, b, c in q)
                     for q in data["queues"]))
