"""Which global ranks a group uses.

Megatron's layout (``ParallelSpec``) puts tp fastest, then cp, then dp, then pp. A *slot* is
one (dp, cp) position, i.e. one tp-wide column of a pipeline: methods that regroup the
data-parallel and context-parallel ranks on the fly (Megatron dynamic CP, FlexSP's
heterogeneous SP groups, SlimPack's DP-merge) hand out slots, and a group of k slots runs
with context-parallel degree k.
"""

from __future__ import annotations

from collections.abc import Sequence

from slimpack.specs import ParallelSpec


def num_slots(parallel: ParallelSpec) -> int:
    """(dp, cp) positions per pipeline stage: the ranks that dynamic CP/SP can regroup."""
    return parallel.dp * parallel.cp


def slot_ranks(parallel: ParallelSpec, slots: Sequence[int]) -> tuple[int, ...]:
    """Ranks of a group over ``slots``, ordered (pp, slot, tp) as ``Group.ranks`` requires."""
    total = num_slots(parallel)
    bad = [s for s in slots if not 0 <= s < total]
    if bad:
        raise ValueError(f"slots {bad} outside [0, {total}) for {parallel.describe()}")
    ranks = []
    for stage in range(parallel.pp):
        for slot in slots:
            dp, cp = divmod(slot, parallel.cp)
            ranks.extend(parallel.rank(dp=dp, pp=stage, cp=cp, tp=t) for t in range(parallel.tp))
    return tuple(ranks)


def replica_groups(parallel: ParallelSpec) -> list[tuple[int, ...]]:
    """The ranks of each data-parallel replica (static CP), ordered (pp, cp, tp)."""
    return [parallel.replica_ranks(d) for d in range(parallel.dp)]


def aligned_blocks(sizes: Sequence[int], total: int) -> list[tuple[int, ...]] | None:
    """Place power-of-two blocks of slots without overlap, each aligned to its size.

    Returns the slots of each block in the order of ``sizes``, or None when they do not fit.
    Aligned power-of-two blocks keep a CP group inside as few nodes as possible.
    """
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    if sum(sizes) > total:
        return None
    out: list[tuple[int, ...] | None] = [None] * len(sizes)
    cursor = 0
    for i in order:
        size = sizes[i]
        if size < 1 or size & (size - 1):
            raise ValueError(f"block sizes must be powers of two, got {size}")
        cursor = -(-cursor // size) * size  # align
        if cursor + size > total:
            return None
        out[i] = tuple(range(cursor, cursor + size))
        cursor += size
    return [b for b in out if b is not None]
