"""Context parallelism for packed documents: K/V all-gathered across the cp group.

Each cp rank holds its zigzag rows of every slice (:mod:`slimpack.runtime.cp_layout`) for the
whole layer stack; norms, MLP, RoPE and the loss are token-local. Attention needs every key of
a query's sequence, so per layer the group all-gathers its ranks' K and V (one collective
for both) and reorders them into buffer order; each rank then attends with its own queries
against the slice's keys and the slice's KV prefix, masked by the global positions of its
queries (:meth:`SliceShard.varlen`). Backward reduce-scatters dK/dV: every rank's queries
contribute to every rank's keys.

A slice caches only this rank's rows of its K/V (``tokens/cp`` per rank, as the simulator's
memory model has it). A later slice of the same sequences gathers its KV prefix again, in
the same collective as its own K/V (one all-gather per layer and slice, one reduce-scatter
back), so the dK/dV it owes the earlier slice arrives as that slice's rows on each rank.

The plan's ``cp_kind="ring"`` is executed this way: an all-gather of K/V is the same
attention as a ring pass of K/V blocks (every query meets every key of its sequence once);
it trades the ring's overlap of transfer and compute for one collective, which on CPU gloo
is both simpler and faster. One collective per layer and slice, in each direction, keeps
every rank of the group issuing them in the same order: they all run the same op list, and
inside a slice's backward layer ``l``'s reduce-scatter needs layer ``l+1``'s result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from slimpack.plan import Group
from slimpack.runtime.attention import VarlenLayout
from slimpack.runtime.cp_layout import QueryPiece, SliceShard, shard_group, whole_segments
from slimpack.runtime.layout import GroupLayout, SegmentPlace

PrefixLeaf = tuple[SegmentPlace, torch.Tensor, torch.Tensor]
"""(earlier segment, this rank's cached K rows of it, V rows) as autograd leaves."""


@dataclass(frozen=True, kw_only=True)
class Exchanged:
    """What one layer's attention of one slice runs on, after the exchange."""

    q: torch.Tensor
    """Queries, in the order of ``pieces``."""
    k: torch.Tensor
    v: torch.Tensor
    """The slice's own keys and values, every row, in buffer order."""
    prefix: dict[SegmentPlace, tuple[torch.Tensor, torch.Tensor]]
    """Each earlier segment's keys and values, every row, in token order."""
    pieces: tuple[QueryPiece, ...]
    varlen: VarlenLayout
    cache: tuple[torch.Tensor, torch.Tensor]
    """What this rank caches of the slice's K/V for later slices (rows per ``cached_rows``)."""
    roots: tuple[torch.Tensor, ...] = ()
    """Collective outputs the backward must reach even when no query of this rank used them."""


# torch 2.13 renames the tensor collectives (the old names warn); torch >= 2.6 has the old.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _GatherRows(torch.autograd.Function):
    """All ranks' local rows -> the whole buffer in buffer order; backward reduce-scatters.

    Ranks hold different row counts, so each pads to the largest before the (equal-size)
    collective and the padding is dropped by the reordering index.
    """

    @staticmethod
    def forward(ctx, local: torch.Tensor, group: dist.ProcessGroup, counts: tuple[int, ...],
                positions: torch.Tensor) -> torch.Tensor:
        width = max(counts)
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[:local.shape[0]] = local
        gathered = local.new_empty((len(counts) * width, *local.shape[1:]))
        _ALL_GATHER(gathered, padded, group=group)
        ctx.group, ctx.width, ctx.num_local, ctx.cp = group, width, local.shape[0], len(counts)
        ctx.save_for_backward(positions)
        return gathered.index_select(0, positions)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (positions,) = ctx.saved_tensors
        padded = grad.new_zeros((ctx.cp * ctx.width, *grad.shape[1:]))
        padded.index_copy_(0, positions, grad.contiguous())
        mine = grad.new_empty((ctx.width, *grad.shape[1:]))
        _REDUCE_SCATTER(mine, padded, op=dist.ReduceOp.SUM, group=ctx.group)
        return mine[:ctx.num_local], None, None, None


@dataclass(frozen=True, kw_only=True)
class RowSpread:
    """Which rows of one buffer (a slice, or one earlier segment of it) every cp rank holds."""

    counts: tuple[int, ...]
    """Rows per cp index."""
    buffer_order: torch.Tensor
    """Buffer row -> row of the cp ranks' rows concatenated in cp order."""


@dataclass(frozen=True, kw_only=True)
class GatherIndex:
    """Where every part's rows land in one padded all-gather (host-side, built once)."""

    totals: tuple[int, ...]
    """Rows per cp index, all parts together."""
    positions: torch.Tensor
    """Row of the padded gather for every row of every part, parts in order, each part in
    its buffer order."""
    sizes: tuple[int, ...]
    """Rows per part."""


def gather_index(spreads: list[RowSpread], cp: CpMember) -> GatherIndex:
    ranks = len(spreads[0].counts)
    totals = [sum(sp.counts[c] for sp in spreads) for c in range(ranks)]
    width = max(totals)
    before = [0] * ranks  # rows of earlier parts in each cp index's block
    positions = []
    for sp in spreads:
        # Row i of a part from cp index c sits at (c's process-group rank) * width, after
        # c's rows of the earlier parts.
        concat = torch.cat([cp.group_rank_of[c] * width + before[c] + torch.arange(n)
                            for c, n in enumerate(sp.counts)])
        positions.append(concat[sp.buffer_order])
        before = [b + n for b, n in zip(before, sp.counts, strict=True)]
    return GatherIndex(totals=tuple(totals), positions=torch.cat(positions),
                       sizes=tuple(int(sp.buffer_order.numel()) for sp in spreads))


def gather_parts(parts: list[torch.Tensor], index: GatherIndex, cp: CpMember
                 ) -> list[torch.Tensor]:
    """Every part (this rank's rows of it) gathered whole, in its buffer order, with one
    all-gather; backward reduce-scatters each part's gradient to its rows' owners."""
    local = torch.cat(parts) if len(parts) > 1 else parts[0]
    whole = _GatherRows.apply(local, cp.group, index.totals, index.positions)
    return list(whole.split(list(index.sizes)))


class LocalExchange:
    """cp = 1: the slice is this rank's alone; attention runs on its segments as they are."""

    collective = False

    def __init__(self, layout: GroupLayout) -> None:
        self.layout = layout

    def shard(self, slice_id: int) -> SliceShard | None:
        return None

    def cached_rows(self, earlier: SegmentPlace) -> slice:
        return earlier.rows

    def exchange(self, slice_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 prefix: list[PrefixLeaf]) -> Exchanged:
        lay = self.layout[slice_id]
        return Exchanged(q=q, k=k, v=v, prefix={e: (kl, vl) for e, kl, vl in prefix},
                         pieces=whole_segments(lay), varlen=lay.varlen, cache=(k, v))

    def finish(self, slice_id: int, o: torch.Tensor) -> torch.Tensor:
        return o


@dataclass(kw_only=True)
class RingExchange:
    """cp > 1, ``cp_kind="ring"``: local queries against the all-gathered K/V."""

    layout: GroupLayout
    shards: dict[int, SliceShard]
    cp: CpMember
    collective: bool = True
    _segments: dict[SegmentPlace, tuple[torch.Tensor, RowSpread]] = field(default_factory=dict)
    _indices: dict[tuple, GatherIndex] = field(default_factory=dict)
    _varlens: dict[int, VarlenLayout] = field(default_factory=dict)

    def shard(self, slice_id: int) -> SliceShard:
        return self.shards[slice_id]

    def _varlen(self, slice_id: int) -> VarlenLayout:
        """This rank's query pieces as one varlen layout, built once per slice (it caches its
        device offsets)."""
        if slice_id not in self._varlens:
            self._varlens[slice_id] = self.shards[slice_id].varlen(self.layout[slice_id])
        return self._varlens[slice_id]

    def cached_rows(self, earlier: SegmentPlace) -> torch.Tensor:
        """This rank's rows of ``earlier`` in its slice's cache (local row indices)."""
        return self._segment(earlier)[0]

    def _segment(self, earlier: SegmentPlace) -> tuple[torch.Tensor, RowSpread]:
        """(this rank's local rows of ``earlier``, where every rank's rows of it lie)."""
        if earlier not in self._segments:
            shard = self.shards[earlier.slice_id]
            lo, hi = earlier.offset, earlier.offset + earlier.num_tokens
            per_rank = shard.rank_order.split(list(shard.counts))
            inside = [rows[(rows >= lo) & (rows < hi)] for rows in per_rank]
            concat = torch.cat(inside) - lo
            order = torch.empty_like(concat)
            order[concat] = torch.arange(len(concat))
            mine = per_rank[self.cp.index]
            local = torch.nonzero((mine >= lo) & (mine < hi)).flatten()
            self._segments[earlier] = (local, RowSpread(
                counts=tuple(len(r) for r in inside), buffer_order=order))
        return self._segments[earlier]

    def exchange(self, slice_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 prefix: list[PrefixLeaf]) -> Exchanged:
        shard = self.shards[slice_id]
        heads = k.shape[1]
        parts = [torch.cat([k, v], dim=1)] + [torch.cat([kl, vl], dim=1) for _, kl, vl in prefix]
        key = (slice_id, tuple(e for e, _, _ in prefix), str(k.device))
        if key not in self._indices:  # the same for every layer of the slice
            spreads = [RowSpread(counts=shard.counts, buffer_order=shard.buffer_order)] + \
                [self._segment(e)[1] for e, _, _ in prefix]
            index = gather_index(spreads, self.cp)
            self._indices[key] = replace(index, positions=index.positions.to(k.device))
        whole = gather_parts(parts, self._indices[key], self.cp)
        return Exchanged(
            q=q, k=whole[0][:, :heads], v=whole[0][:, heads:],
            prefix={e: (w[:, :heads], w[:, heads:])
                    for (e, _, _), w in zip(prefix, whole[1:], strict=True)},
            pieces=shard.pieces, varlen=self._varlen(slice_id), cache=(k, v),
            roots=(whole[0],))

    def finish(self, slice_id: int, o: torch.Tensor) -> torch.Tensor:
        return o


@dataclass(frozen=True, kw_only=True)
class CpMember:
    """This rank's place in one plan group's cp group."""

    group: dist.ProcessGroup
    index: int
    """Position in the plan's cp order (which zigzag chunks this rank holds)."""
    group_rank_of: tuple[int, ...]
    """Process-group rank of every cp index: ``new_group`` orders members by global rank,
    the plan by its ``ranks`` list (a DP-Merge group may list them in any order)."""


def make_exchange(group: Group, layout: GroupLayout, *, cp: CpMember | None):
    """The attention exchange this rank runs for ``group`` (the plan's cp and cp_kind)."""
    if group.cp == 1:
        return LocalExchange(layout)
    if cp is None:
        raise ValueError(f"group {group.group_id}: cp={group.cp} needs its cp process group")
    shards = shard_group(group, layout, cp_index=cp.index)
    if group.cp_kind == "ulysses":
        from slimpack.runtime.ulysses import UlyssesExchange  # noqa: PLC0415 (ulysses imports us)
        return UlyssesExchange(layout=layout, shards=shards, cp=cp)
    return RingExchange(layout=layout, shards=shards, cp=cp)


@dataclass(frozen=True, kw_only=True)
class CpGroups:
    """This rank's cp group membership in every plan group it belongs to (None: cp = 1)."""

    by_group: dict[int, CpMember | None]

    @classmethod
    def build(cls, groups: list[Group], *, rank: int) -> CpGroups:
        """Collective over the default group: every rank creates every cp group (the ranks of
        one stage with the same tp index, in cp order) in the same order."""
        made: dict[tuple[int, ...], dist.ProcessGroup] = {}
        mine: dict[int, CpMember | None] = {}
        for g in groups:
            if g.cp == 1:
                if rank in g.ranks:
                    mine[g.group_id] = None
                continue
            for stage in range(g.pp):
                stage_ranks = g.stage_ranks(stage)
                for t in range(g.tp):
                    members = stage_ranks[t::g.tp]  # (cp, tp) order, tp fastest
                    key = tuple(sorted(members))
                    if key not in made:
                        made[key] = dist.new_group(list(key))
                    if rank in members:
                        mine[g.group_id] = CpMember(
                            group=made[key], index=members.index(rank),
                            group_rank_of=tuple(key.index(m) for m in members))
        return cls(by_group=mine)

    def of(self, group_id: int) -> CpMember | None:
        return self.by_group[group_id]
