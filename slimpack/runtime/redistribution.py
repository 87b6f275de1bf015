"""SlimPipe's attention redistribution executed between pipeline ranks (docs/architecture.md,
runtime, "Attention redistribution").

Which ops pair and how much of each segment's KV prefix moves is the plan's
(``Group.attention_moves``, chosen at plan time by
:func:`slimpack.sim.redistribution.priced_moves` under the planner's cost model, the moves the
simulator prices): a :class:`~slimpack.plan.Move` names a heavy op and a light op of the
same tick and the share of the prefix shipped. Here every rank turns its group's moves into

* on the heavy rank, per slice of the heavy op's unit on that block, a :class:`SliceSplit`:
  its attention (:class:`_SplitAttention`) computes each shipped segment's first ``d`` prefix
  keys on the light rank and the rest locally, merged by log-sum-exp; in backward the same
  with the backward move's ``d`` (forward and backward are paired separately): the heavy rank
  ships query, output gradient, log-sum-exp and ``delta = rowsum(dO * O)`` plus the KV block,
  and receives dQ and the block's dK, dV, which flow into the prefix leaves and from there
  into the slice KV cache's dK/dV accumulators exactly as locally computed ones do;
* on the light rank, a :class:`Server` thread answering those requests in tick order. The
  attention core has no parameters, so the shipped tensors are all it needs.

Every rank waits only on ops of its tick or earlier: a heavy op waits for its light rank's
server, which serves moves in tick order and never waits for its own rank's main thread. On
CPU the goal is exactness and no deadlock, not overlap: the server runs beside the light
rank's own ops (threads of one process), and its time is not in the rank's busy seconds.

Lanes. A stage is ``tp*cp`` ranks; the simulator pairs the rank at in-stage offset ``i`` of
one stage with the rank at offset ``i`` of the other (the same tp and cp index), so every such
*lane pair* has its own link (one process group per (heavy rank, light rank), built by every
rank in the same order and passed in). With tp > 1 a lane holds ``heads/tp`` query heads (and
its kv heads) and ships only those. With ring CP (cp > 1) a lane holds its query pieces of the
slice (:mod:`slimpack.runtime.cp_layout`) and, after the exchange's all-gather, the whole KV
prefix of their sequences: the shipped block of a piece is the first ``d`` keys of its
segment's prefix (the move's ``d`` for that segment, the same on every cp rank), the light
lane computes it for that piece's query rows, and its dK/dV flow back through the all-gather
into the reduce-scatter like locally computed ones. A piece is a row of the varlen layout, so
a shipment is keyed by piece; at cp = 1 a piece is a whole segment. Both ends of a lane pair
have the same cp index, so the light lane knows the pieces (shapes) from its own shards.

Recompute. Under ``selective`` or ``full`` the layer's attention runs again in backward. The
rerun must not ship again (the light rank serves each forward move once, at its tick), so the
split keeps the light rank's partial result (output rows and log-sum-exp of the shipped
pieces, per layer) from the forward until that layer's backward and merges it with the
recomputed local part: the same numbers as the first forward, so gradients stay exact. Those
partials are not in the rank's saved-activation bytes (the simulator does not price them
either; they are ``rows x heads x (head_dim + 1)`` per layer of a shipping slice).

Ulysses CP (``cp_kind="ulysses"``) is refused (:mod:`slimpack.runtime.capabilities`): the
simulator prices each cp rank's row pieces, while a Ulysses rank attends every row with
``heads/cp`` heads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from slimpack.plan import Group, Move
from slimpack.runtime.attention import VarlenLayout
from slimpack.runtime.block_attention import (
    accumulate_dtype,
    block_backward,
    block_forward,
    merge,
)
from slimpack.runtime.cp_layout import QueryPiece
from slimpack.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Shipment:
    """What one slice's attention ships per layer in one direction."""

    segments: dict[int, int]
    """Query piece index (a row of the slice's varlen layout on this lane) -> KV tokens
    shipped (the first ones of its segment's prefix)."""
    q_lens: tuple[int, ...]
    """Query rows of the shipped pieces, in piece order."""

    @property
    def k_lens(self) -> tuple[int, ...]:
        return tuple(self.segments.values())


@dataclass(kw_only=True)
class Link:
    """One direction of one rank pair: the heavy rank's main thread on one end, the light
    rank's server on the other. Both ends number the messages the same way (tags)."""

    group: dist.ProcessGroup
    peer: int
    sent: int = 0

    def _tag(self) -> int:
        self.sent += 1
        return self.sent

    def post(self, tensors: list[torch.Tensor]) -> list:
        works = []
        for t in tensors:
            buf = t.contiguous()
            works.append((dist.isend(buf, dst=self.peer, group=self.group, tag=self._tag()), buf))
        return works

    def take(self, like: list[tuple[tuple[int, ...], torch.dtype]], device: torch.device
             ) -> list[torch.Tensor]:
        bufs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in like]
        works = [dist.irecv(b, src=self.peer, group=self.group, tag=self._tag()) for b in bufs]
        for w in works:
            w.wait()
        return bufs


@dataclass(kw_only=True)
class SliceSplit:
    """One slice's redistributed attention on the heavy rank (either direction may be
    local)."""

    forward: Shipment | None
    backward: Shipment | None
    forward_link: Link | None
    backward_link: Link | None
    counter: list[int]
    """Requests this rank sent (one per layer per direction), shared by its splits."""
    keep_remote: bool = False
    """Recompute: keep the light rank's forward partials for the backward's rerun."""
    remote: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """Layer -> the light rank's (output rows, log-sum-exp) of the forward shipment, kept
    from the forward until that layer's backward (``keep_remote``)."""

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  varlen: VarlenLayout, layer: int) -> torch.Tensor:
        return _SplitAttention.apply(q, k, v, self, varlen, layer)

    def _remote_forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        rows: list[tuple[int, int]], keys: list[tuple[int, int]],
                        lse_dtype: torch.dtype, layer: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """The light rank's partials of this layer: asked for once; a recompute rerun reuses
        the ones the forward received."""
        if layer in self.remote:
            return self.remote[layer]
        link = self.forward_link
        works = link.post([_gather(q, rows), _gather(k, keys), _gather(v, keys)])
        n = sum(b - a for a, b in rows)
        o2, lse2 = link.take([((n, *q.shape[1:]), q.dtype), ((n, q.shape[1]), lse_dtype)],
                             q.device)
        for w, _ in works:
            w.wait()
        self.counter[0] += 1
        if self.keep_remote:
            self.remote[layer] = (o2, lse2)
        return o2, lse2


def _ship_rows(varlen: VarlenLayout, ship: Shipment
               ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(query row ranges, shipped key row ranges) of the shipped segments."""
    cu_q, cu_k = varlen.cu_q, varlen.cu_k
    rows = [(cu_q[i], cu_q[i + 1]) for i in ship.segments]
    keys = [(cu_k[i], cu_k[i] + d) for i, d in ship.segments.items()]
    return rows, keys


def _gather(t: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([t[a:b] for a, b in ranges])


def _local_keys(varlen: VarlenLayout, ship: Shipment | None) -> tuple[list[int], list[int]]:
    """(key row indexes kept locally, their per-segment lengths)."""
    cu_k = varlen.cu_k
    index, lens = [], []
    for i, (a, b) in enumerate(zip(cu_k[:-1], cu_k[1:], strict=True)):
        d = ship.segments.get(i, 0) if ship is not None else 0
        index.extend(range(a + d, b))
        lens.append(b - a - d)
    return index, lens


class _SplitAttention(torch.autograd.Function):
    """Causal varlen attention of one slice with the shipped prefix blocks computed on the
    light rank (forward and backward each by their own shipment)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # noqa: ANN001, ANN205
                split: SliceSplit, varlen: VarlenLayout, layer: int):
        ship = split.forward
        keep, keep_lens = _local_keys(varlen, ship)
        idx = torch.tensor(keep, dtype=torch.long, device=q.device)
        out, lse = block_forward(q, k[idx], v[idx], varlen.q_lens, keep_lens, causal=True)
        if ship is not None:
            rows, keys = _ship_rows(varlen, ship)
            o2, lse2 = split._remote_forward(q, k, v, rows, keys, lse.dtype, layer)
            row_index = torch.cat([torch.arange(a, b, device=q.device) for a, b in rows])
            merged, merged_lse = merge([(out[row_index], lse[row_index]), (o2, lse2)])
            out = out.index_copy(0, row_index, merged)
            lse = lse.index_copy(0, row_index, merged_lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.split, ctx.varlen, ctx.layer = split, varlen, layer
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        split, varlen = ctx.split, ctx.varlen
        split.remote.pop(ctx.layer, None)  # the rerun (if any) has used it
        ship = split.backward
        delta = (d_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1)
        keep, keep_lens = _local_keys(varlen, ship)
        idx = torch.tensor(keep, dtype=torch.long, device=q.device)
        dq, dk_kept, dv_kept = block_backward(q, k[idx], v[idx], d_out, lse, delta,
                                              varlen.q_lens, keep_lens, causal=True)
        dk = torch.zeros_like(k).index_copy(0, idx, dk_kept)
        dv = torch.zeros_like(v).index_copy(0, idx, dv_kept)
        if ship is not None:
            rows, keys = _ship_rows(varlen, ship)
            link = split.backward_link
            works = link.post([_gather(q, rows), _gather(k, keys), _gather(v, keys),
                               _gather(d_out, rows), _gather(lse, rows), _gather(delta, rows)])
            n, nk = sum(b - a for a, b in rows), sum(b - a for a, b in keys)
            dq2, dk2, dv2 = link.take([((n, *q.shape[1:]), q.dtype), ((nk, *k.shape[1:]), k.dtype),
                                       ((nk, *v.shape[1:]), v.dtype)], q.device)
            for w, _ in works:
                w.wait()
            split.counter[0] += 1
            row_index = torch.cat([torch.arange(a, b, device=q.device) for a, b in rows])
            key_index = torch.cat([torch.arange(a, b, device=q.device) for a, b in keys])
            dq = dq.index_add(0, row_index, dq2)
            dk = dk.index_copy(0, key_index, dk2)
            dv = dv.index_copy(0, key_index, dv2)
        return dq, dk, dv, None, None, None


PiecesOf = Callable[[int], tuple[QueryPiece, ...]]
"""Slice id -> this lane's query pieces of it, in its varlen order (the exchange's)."""


def shipment(group: Group, move: Move, slice_id: int, pieces: tuple[QueryPiece, ...]
             ) -> Shipment | None:
    """What ``move`` ships of ``slice_id`` from a lane holding ``pieces`` of it (None:
    nothing, e.g. a slice without a prefix or a cp rank without rows of shipped segments)."""
    by_segment = {j: d for sid, j, d in move.shipped(group) if sid == slice_id}
    segs = {i: by_segment[p.segment] for i, p in enumerate(pieces) if p.segment in by_segment}
    if not segs:
        return None
    return Shipment(segments=segs, q_lens=tuple(pieces[i].hi - pieces[i].lo for i in segs))


def _lane_rank(group: Group, block: int, lane: int) -> int:
    """The rank at in-stage offset ``lane`` of the stage running ``block`` of ``group``."""
    return group.stage_ranks(block % group.pp)[lane]


def _lane(group: Group, block: int, rank: int) -> int | None:
    """``rank``'s in-stage offset on the stage running ``block`` (None: not on it)."""
    ranks = group.stage_ranks(block % group.pp)
    return ranks.index(rank) if rank in ranks else None


def local_heads(spec: ModelSpec, tp: int) -> tuple[int, int]:
    """(query heads, kv heads) one tp rank attends with (a replicated kv head if tp > kv)."""
    return spec.num_heads // tp, max(1, spec.num_kv_heads // tp)


@dataclass(kw_only=True)
class RankRedistribution:
    """This rank's side of every group's moves, and the links they use."""

    rank: int
    moves: dict[int, tuple[Move, ...]]
    links: dict[tuple[int, int], Link]
    """(heavy rank, light rank) -> link, for the pairs this rank is on."""
    sent: list[int] = field(default_factory=lambda: [0])
    served: list[int] = field(default_factory=lambda: [0])

    @classmethod
    def build(cls, moves: dict[int, tuple[Move, ...]], groups: dict[int, Group], *,
              rank: int) -> RankRedistribution:
        """Collective: every rank creates every lane pair's group in the same order."""
        pairs = sorted({(_lane_rank(groups[gid], m.heavy_block, lane),
                         _lane_rank(groups[gid], m.light_block, lane))
                        for gid, ms in moves.items() for m in ms
                        for lane in range(groups[gid].tp * groups[gid].cp)})
        links = {}
        for heavy, light in pairs:
            pg = dist.new_group(sorted({heavy, light}))
            if rank in (heavy, light):
                links[(heavy, light)] = Link(group=pg, peer=light if rank == heavy else heavy)
        return cls(rank=rank, moves=moves, links=links)

    def splits(self, group: Group, block: int, pieces_of: PiecesOf, *, keep_remote: bool
               ) -> dict[int, SliceSplit]:
        """Slice id -> its split, for the slices this rank runs as heavy on ``block``
        (``keep_remote``: the group recomputes attention in backward)."""
        out: dict[int, SliceSplit] = {}
        lane = _lane(group, block, self.rank)
        for m in self.moves.get(group.group_id, ()):
            if m.heavy_block != block or lane is None:
                continue
            units = group.backward_units if m.backward else group.forward_units
            link = self.links[(self.rank, _lane_rank(group, m.light_block, lane))]
            for sid in units[m.heavy_unit].slice_ids:
                ship = shipment(group, m, sid, pieces_of(sid))
                if ship is None:
                    continue
                split = out.setdefault(sid, SliceSplit(forward=None, backward=None,
                                                       forward_link=None, backward_link=None,
                                                       counter=self.sent,
                                                       keep_remote=keep_remote))
                if m.backward:
                    split.backward, split.backward_link = ship, link
                else:
                    split.forward, split.forward_link = ship, link
        return out

    def server(self, group: Group, spec: ModelSpec, pieces_of: PiecesOf, *,
               dtype: torch.dtype, device: torch.device) -> Server | None:
        """The thread answering this rank's light side of ``group``'s moves (None: none).
        ``pieces_of`` is this rank's: its heavy counterpart has the same cp index."""
        mine = sorted((m for m in self.moves.get(group.group_id, ())
                       if _lane(group, m.light_block, self.rank) is not None),
                      key=lambda m: m.tick)
        if not mine:
            return None
        return Server(group=group, moves=mine, links=self.links, rank=self.rank, spec=spec,
                      pieces_of=pieces_of, dtype=dtype, device=device, served=self.served)


class Server(threading.Thread):
    """Answers the heavy ranks' per-layer requests of one group's moves, in tick order."""

    def __init__(self, *, group: Group, moves: list[Move], links: dict[tuple[int, int], Link],
                 rank: int, spec: ModelSpec, pieces_of: PiecesOf, dtype: torch.dtype,
                 device: torch.device, served: list[int]) -> None:
        super().__init__(daemon=True)
        self.group, self.moves, self.links, self.rank = group, moves, links, rank
        self.pieces_of = pieces_of
        self.spec, self.dtype, self.device, self.served = spec, dtype, device, served
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with torch.no_grad():
                for m in self.moves:
                    self._serve(m)
        except BaseException as exc:  # re-raised in the main thread by finish()
            self.error = exc

    def finish(self) -> None:
        self.join()
        if self.error is not None:
            raise RuntimeError(f"rank {self.rank}: attention redistribution server failed"
                               ) from self.error

    def _serve(self, m: Move) -> None:
        group, spec = self.group, self.spec
        lane = _lane(group, m.light_block, self.rank)
        link = self.links[(_lane_rank(group, m.heavy_block, lane), self.rank)]
        units = group.backward_units if m.backward else group.forward_units
        layers = spec.num_layers // (group.pp * group.vpp)
        (heads, kv_heads), dim = local_heads(spec, group.tp), spec.head_dim
        for sid in units[m.heavy_unit].slice_ids:
            ship = shipment(group, m, sid, self.pieces_of(sid))
            if ship is None:
                continue
            n, nk = sum(ship.q_lens), sum(ship.k_lens)
            q_like = ((n, heads, dim), self.dtype)
            kv_like = ((nk, kv_heads, dim), self.dtype)
            row_like = ((n, heads), accumulate_dtype(self.dtype))
            for _ in range(layers):
                if m.backward:
                    q, k, v, d_out, lse, delta = link.take(
                        [q_like, kv_like, kv_like, q_like, row_like, row_like], self.device)
                    replies = block_backward(q, k, v, d_out, lse, delta, ship.q_lens,
                                             ship.k_lens, causal=False)
                else:
                    q, k, v = link.take([q_like, kv_like, kv_like], self.device)
                    replies = block_forward(q, k, v, ship.q_lens, ship.k_lens, causal=False)
                for w, _ in link.post(list(replies)):
                    w.wait()
                self.served[0] += 1
