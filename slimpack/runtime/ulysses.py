"""Ulysses sequence parallelism: swap sequence shards for head shards around attention.

Each of the group's ``cp`` ranks holds its rows of every slice for the layer stack (the same
row rule as ring CP, :mod:`slimpack.runtime.cp_layout`: with full-sequence attention the
zigzag only spreads rows, any split gives the same numbers). Before attention one
all-to-all sends head group ``c`` of this rank's Q, K, V rows to cp rank ``c`` and receives
every rank's rows of its own head group, so each rank attends over the whole slice (its
segments, their KV prefix) with ``heads/cp`` query heads; a second all-to-all returns the
output rows to their owners. Uneven row counts are all-to-all splits, not padding.

Heads must split evenly (checked before launch). K/V heads that do not divide by ``cp``
(GQA with fewer K/V heads than ranks) are repeated to one per query head first, which keeps
every query head with its own K/V head. The slice's cached K/V is its head shard of the
whole slice, the form later slices' head-sharded queries read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from slimpack.runtime.context_parallel import CpMember, Exchanged, PrefixLeaf
from slimpack.runtime.cp_layout import SliceShard, whole_segments
from slimpack.runtime.layout import GroupLayout, SegmentPlace


class _AllToAll(torch.autograd.Function):
    """Rows ``[sum(send), ...]`` split ``send`` per group rank -> rows split ``recv``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, send: list[int],
                recv: list[int]) -> torch.Tensor:
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv,
                               input_split_sizes=send, group=group)
        ctx.group, ctx.send, ctx.recv = group, send, recv
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=ctx.send,
                               input_split_sizes=ctx.recv, group=ctx.group)
        return back, None, None, None


def heads_to_ranks(x: torch.Tensor, cp: int) -> torch.Tensor:
    """``[n, H, D]`` -> ``[cp, n, H/cp, D]``: head group c of every row, group by group."""
    n, heads, dim = x.shape
    return x.view(n, cp, heads // cp, dim).transpose(0, 1)


@dataclass(kw_only=True)
class UlyssesExchange:
    layout: GroupLayout
    shards: dict[int, SliceShard]
    cp: CpMember
    collective: bool = True
    _order_cache: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict)

    def shard(self, slice_id: int) -> SliceShard:
        return self.shards[slice_id]

    def cached_rows(self, earlier: SegmentPlace) -> slice:
        """A slice caches its head shard of every row, so a segment is its buffer rows."""
        return earlier.rows

    def _by_group_rank(self, per_cp_index: list[torch.Tensor] | tuple[int, ...]) -> list:
        """Reorder per-cp-index items into process-group rank order (all_to_all's order)."""
        out = [None] * len(per_cp_index)
        for c, item in enumerate(per_cp_index):
            out[self.cp.group_rank_of[c]] = item
        return out

    def _orders(self, slice_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(buffer row -> row of the received, group-rank ordered concatenation; and back),
        on ``device``, built once per slice."""
        key = (slice_id, str(device))
        if key not in self._order_cache:
            shard = self.shards[slice_id]
            counts = self._by_group_rank(shard.counts)
            starts = [0]
            for n in counts[:-1]:
                starts.append(starts[-1] + n)
            # Received row of the i-th row of cp index c: start of c's block + i.
            per_index = [starts[self.cp.group_rank_of[c]] + torch.arange(n)
                         for c, n in enumerate(shard.counts)]
            to_concat = torch.cat(per_index)[shard.buffer_order]
            to_buffer = torch.empty_like(to_concat)
            to_buffer[to_concat] = torch.arange(len(to_concat))
            self._order_cache[key] = (to_concat.to(device), to_buffer.to(device))
        return self._order_cache[key]

    def exchange(self, slice_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 prefix: list[PrefixLeaf]) -> Exchanged:
        shard, lay = self.shards[slice_id], self.layout[slice_id]
        cp = len(shard.counts)
        if k.shape[1] % cp:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        hq, hk = q.shape[1] // cp, k.shape[1] // cp
        # [cp, n, W, D] with W = this rank's share of Q, K and V heads for each target.
        packed = torch.cat([heads_to_ranks(t, cp) for t in (q, k, v)], dim=2)
        ordered = torch.stack(self._by_group_rank(list(packed.unbind(0))))
        send = [shard.num_local] * cp
        recv = self._by_group_rank(shard.counts)
        rows = _AllToAll.apply(ordered.reshape(-1, *packed.shape[2:]), self.cp.group, send,
                               recv)
        rows = rows.index_select(0, self._orders(slice_id, rows.device)[0])
        q_h, k_h, v_h = rows.split([hq, hk, hk], dim=1)
        # Whole segments: the slice's own varlen layout (its device offsets built once).
        return Exchanged(q=q_h, k=k_h, v=v_h, prefix={e: (kl, vl) for e, kl, vl in prefix},
                         pieces=whole_segments(lay), varlen=lay.varlen, cache=(k_h, v_h))

    def finish(self, slice_id: int, o: torch.Tensor) -> torch.Tensor:
        """Whole-slice output of this rank's heads -> this rank's rows, all heads."""
        shard = self.shards[slice_id]
        cp = len(shard.counts)
        # Received-concatenation order, so each group rank's block goes back to it.
        grouped = o.index_select(0, self._orders(slice_id, o.device)[1])
        send = self._by_group_rank(shard.counts)
        mine = _AllToAll.apply(grouped, self.cp.group, send, [shard.num_local] * cp)
        # [cp (group rank), n, H/cp, D] -> cp index order -> [n, H, D].
        blocks = mine.view(cp, shard.num_local, *o.shape[1:])
        by_index = blocks[list(self.cp.group_rank_of)]
        return by_index.transpose(0, 1).reshape(shard.num_local, cp * o.shape[1], o.shape[2])
