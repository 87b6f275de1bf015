"""Which rows of a slice's packed buffer each context-parallel rank holds (docs/architecture.md).

The rule is the simulator's own (:mod:`slimpack.cost.cp_sharding`): the slice buffer (or,
``per-document``, every segment on its own) is cut into ``2*cp`` chunks and rank ``r`` holds
chunks ``r`` and ``2cp-1-r``. ``shard_pieces`` takes ``(tokens, kv_prefix)`` pieces and
shifts every output chunk by its piece's ``kv_prefix``; handing it each segment's *buffer
offset* as the prefix makes its output ``(tokens, first buffer row)``, so the runtime holds
exactly the token ranges the simulator prices, not a re-implementation of them.

A rank's local buffer is its row ranges concatenated in that order. Every range lies inside
one segment, so it is one row of a varlen attention call: its queries are the range, its keys
the segment's KV prefix plus the segment's keys up to the range's end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slimpack.cost.cp_sharding import shard_pieces
from slimpack.plan import Group
from slimpack.runtime.attention import VarlenLayout
from slimpack.runtime.layout import GroupLayout, SliceLayout


@dataclass(frozen=True, kw_only=True, slots=True)
class QueryPiece:
    """Query rows ``[lo, hi)`` of the slice buffer, all inside segment ``segment``."""

    segment: int
    """Index into :attr:`SliceLayout.segments`."""
    lo: int
    hi: int


@dataclass(frozen=True, kw_only=True)
class SliceShard:
    """One rank's share of one slice, and how the whole cp group's rows interleave."""

    rows: torch.Tensor
    """Buffer rows this rank holds, in local order (int64)."""
    pieces: tuple[QueryPiece, ...]
    """This rank's rows as attention query pieces, in local order."""
    counts: tuple[int, ...]
    """Rows every cp rank holds (cp entries)."""
    rank_order: torch.Tensor
    """Buffer rows of every rank's local buffer, rank after rank (a permutation of the
    buffer): row ``i`` of the ranks' concatenated buffers is buffer row ``rank_order[i]``."""
    buffer_order: torch.Tensor
    """The inverse: buffer row ``b`` is row ``buffer_order[b]`` of the concatenation."""

    @property
    def num_local(self) -> int:
        return int(self.rows.numel())

    def varlen(self, lay: SliceLayout, pieces: tuple[QueryPiece, ...] | None = None
               ) -> VarlenLayout:
        """Varlen layout of ``pieces`` (default: this rank's): each piece's keys are its
        sequence's tokens up to the piece's last query (bottom-right causal)."""
        pieces = self.pieces if pieces is None else pieces
        segs = lay.segments
        return VarlenLayout(q_lens=tuple(p.hi - p.lo for p in pieces),
                            k_lens=tuple(segs[p.segment].start + p.hi - segs[p.segment].offset
                                         for p in pieces))


def whole_segments(lay: SliceLayout) -> tuple[QueryPiece, ...]:
    """Every segment of the slice as one query piece (attention over the whole slice)."""
    return tuple(QueryPiece(segment=i, lo=s.offset, hi=s.offset + s.num_tokens)
                 for i, s in enumerate(lay.segments))


def rank_row_ranges(lay: SliceLayout, cp: int, sharding: str) -> list[list[tuple[int, int]]]:
    """Per cp rank, its ``[lo, hi)`` buffer row ranges in local order (``cp_sharding`` rule)."""
    pieces = [(seg.num_tokens, seg.offset) for seg in lay.segments]
    return [[(row, row + n) for n, row in rank] for rank in shard_pieces(pieces, cp, sharding)]


def shard_slice(lay: SliceLayout, *, cp: int, cp_index: int, sharding: str) -> SliceShard:
    """Rank ``cp_index``'s share of the slice ``lay`` under ``sharding``."""
    if not 0 <= cp_index < cp:
        raise ValueError(f"cp_index must be in [0, {cp}), got {cp_index}")
    ranges = rank_row_ranges(lay, cp, sharding)
    starts = [s.offset for s in lay.segments]

    def segment_of(row: int) -> int:
        # The last segment starting at or before ``row`` (segments are packed in order).
        return max(i for i, start in enumerate(starts) if start <= row)

    def rows_of(rank: list[tuple[int, int]]) -> list[int]:
        return [r for lo, hi in rank for r in range(lo, hi)]

    order = [r for rank in ranges for r in rows_of(rank)]
    if sorted(order) != list(range(lay.num_tokens)):
        raise AssertionError(f"slice {lay.slice_id}: cp sharding does not cover its buffer once")
    rank_order = torch.tensor(order, dtype=torch.long)
    buffer_order = torch.empty_like(rank_order)
    buffer_order[rank_order] = torch.arange(len(order))
    mine = ranges[cp_index]
    return SliceShard(
        rows=torch.tensor(rows_of(mine), dtype=torch.long),
        pieces=tuple(QueryPiece(segment=segment_of(lo), lo=lo, hi=hi) for lo, hi in mine),
        counts=tuple(sum(hi - lo for lo, hi in rank) for rank in ranges),
        rank_order=rank_order, buffer_order=buffer_order)


def shard_group(group: Group, layout: GroupLayout, *, cp_index: int) -> dict[int, SliceShard]:
    """Rank ``cp_index``'s share of every slice of ``group`` (its ``cp``, ``cp_sharding``)."""
    return {sl.slice_id: shard_slice(layout[sl.slice_id], cp=group.cp, cp_index=cp_index,
                                     sharding=group.cp_sharding) for sl in group.slices}


def local_inputs(inputs: tuple[torch.Tensor, ...], shard: SliceShard
                 ) -> tuple[torch.Tensor, ...]:
    """A slice's (ids, labels, positions) restricted to this rank's rows, in local order."""
    return tuple(t.index_select(0, shard.rows.to(t.device)) for t in inputs)
