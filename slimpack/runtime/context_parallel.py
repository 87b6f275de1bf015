"""Context parallelism for packed documents: K/V all-gathered across the cp group.

Each cp rank holds its zigzag rows of every slice (:mod:`slimpack.runtime.cp_layout`) for the
whole layer stack; norms, MLP, RoPE and the loss are token-local. Attention needs every key of
a query's sequence, so per layer the group all-gathers its ranks' K and V (one collective
for both) and reorders them into buffer order; each rank then attends with its own queries
against the slice's keys and the slice's KV prefix, masked by the global positions of its
queries (:meth:`SliceShard.varlen`). Backward reduce-scatters dK/dV: every rank's queries
contribute to every rank's keys.

The gathered K/V is what the slice caches for later slices of its sequences: every cp rank
keeps the whole slice's keys, so a later slice's prefix needs no further communication, and
the dK/dV later slices accumulate into it flows into the same reduce-scatter.

The plan's ``cp_kind="ring"`` is executed this way: an all-gather of K/V is the same
attention as a ring pass of K/V blocks (every query meets every key of its sequence once);
it trades the ring's overlap of transfer and compute for one collective, which on CPU gloo
is both simpler and faster. The collectives of one slice's forward (and backward) run in
layer order on every rank of the group, because they all run the same op list.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from slimpack.plan import Group
from slimpack.runtime.attention import VarlenLayout
from slimpack.runtime.cp_layout import QueryPiece, SliceShard, shard_group, whole_segments
from slimpack.runtime.layout import GroupLayout

Exchanged = tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[QueryPiece, ...],
                  VarlenLayout]
"""(queries, keys, values, query pieces, varlen layout) as the attention call takes them."""


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
        dist.all_gather_into_tensor(gathered, padded, group=group)
        ctx.group, ctx.width, ctx.num_local, ctx.cp = group, width, local.shape[0], len(counts)
        ctx.save_for_backward(positions)
        return gathered.index_select(0, positions)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (positions,) = ctx.saved_tensors
        padded = grad.new_zeros((ctx.cp * ctx.width, *grad.shape[1:]))
        padded.index_copy_(0, positions, grad.contiguous())
        mine = grad.new_empty((ctx.width, *grad.shape[1:]))
        dist.reduce_scatter_tensor(mine, padded, op=dist.ReduceOp.SUM, group=ctx.group)
        return mine[:ctx.num_local], None, None, None


def gather_rows(local: torch.Tensor, shard: SliceShard, cp: CpMember) -> torch.Tensor:
    """The whole slice buffer from every cp rank's ``local`` rows, differentiably."""
    counts = shard.counts
    width = max(counts)
    # Row of the padded gather holding each row of the ranks' concatenated buffers: cp
    # index c's i-th row sits at (its process-group rank) * width + i.
    padded_row = torch.cat([cp.group_rank_of[c] * width + torch.arange(n)
                            for c, n in enumerate(counts)])
    positions = padded_row[shard.buffer_order].to(local.device)
    return _GatherRows.apply(local, cp.group, tuple(counts), positions)


class LocalExchange:
    """cp = 1: the slice is this rank's alone; attention runs on its segments as they are."""

    collective = False

    def __init__(self, layout: GroupLayout) -> None:
        self.layout = layout

    def shard(self, slice_id: int) -> SliceShard | None:
        return None

    def exchange(self, slice_id: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> Exchanged:
        lay = self.layout[slice_id]
        return q, k, v, whole_segments(lay), lay.varlen

    def finish(self, slice_id: int, o: torch.Tensor) -> torch.Tensor:
        return o


@dataclass(kw_only=True)
class RingExchange:
    """cp > 1, ``cp_kind="ring"``: local queries against the all-gathered slice K/V."""

    layout: GroupLayout
    shards: dict[int, SliceShard]
    cp: CpMember
    collective: bool = True

    def shard(self, slice_id: int) -> SliceShard:
        return self.shards[slice_id]

    def exchange(self, slice_id: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> Exchanged:
        shard, lay = self.shards[slice_id], self.layout[slice_id]
        heads = k.shape[1]
        kv = gather_rows(torch.cat([k, v], dim=1), shard, self.cp)
        return q, kv[:, :heads], kv[:, heads:], shard.pieces, shard.varlen(lay)

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
