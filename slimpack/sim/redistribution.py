"""SlimPipe's attention redistribution between pipeline ranks (arXiv 2504.14519).

Under slice-level 1F1B, later slices of a sample carry longer KV prefixes, so pipeline ranks
that run different slices at the same time do different amounts of attention. SlimPipe pairs
those ranks, longest KV prefix with shortest; the heavy rank ships its query and part of its
cached KV to the light one, which computes that block and returns partial outputs that are
merged with the log-sum-exp trick. This module moves that work between the two ops' durations
before the timing walk (:func:`group_moves`); everything else in the walk is unchanged.

Which ops run concurrently (*reconstructed*: the paper's pairing rule at run time is not
known here). An op's *tick* is its start time when every op of the schedule takes one unit
and transfers are free (:func:`schedule_ticks`): a deterministic property of the op lists,
not of the prices, so the pairing does not depend on the result it changes. Forward ops of
one tick form one set and backward ops another; within a set, ops are sorted by query tokens
times KV prefix (:func:`prefix_weight`: longest prefix first for SlimPipe's one-document
slices, its generalisation when a slice packs several documents) and paired first with last.
A tick's moves are kept only if they make its slowest op (forward or backward) faster: the
ops of a tick run side by side, so otherwise the transfers would buy nothing.

What moves. The heavy op keeps its queries' causal diagonal blocks and ships a fraction ``f``
of each segment's KV prefix (whole 128-token tiles); ``f`` is the one that equalises the two
ops' durations (layers, LM-head share and CP communication included, as the simulator priced
them), found by interpolation and one secant step. The change on each side is priced by the
cost model itself (``layer_times``), not by FLOPs: on the heavy rank its prefixed pieces
before and after shortening, on the light rank the shipped block as
``layer_times([(q, d)]) - layer_times([(q, 0)])`` (the query-by-prefix rectangle alone),
times the op's layers. With CP, rank ``r`` of one stage pairs with rank ``r`` of the other and
an op changes by its ranks' least favourable change (exact for cp = 1, conservative above).
With ring CP the simulator charges a layer the longer of its compute and its ring's K/V steps
(:func:`~slimpack.sim.costs.unit_layer_seconds`), and the shipped block moves compute alone:
the heavy op's layers shrink no further than their steps, and the light op's first fill the
time they waited on theirs.

Transfers, per layer, priced by the comm model on the link between the two stages
(*reconstructed* overlap): forward, the heavy rank sends its query and the KV block; the KV
is cached from earlier slices, so it can travel while the light rank computes its own
attention and is charged only where it is longer than that; the query exists only once the
layer's projection has run and the partial outputs (bf16 plus fp32 log-sum-exp per head) are
needed before the output projection, so both are exposed and charged to both ops (the heavy
one waits for the partials). Backward sends query, output gradient and log-sum-exp plus the
KV block, and returns dQ and the block's dK, dV.

Which pairs move is chosen here (:func:`group_moves`, at plan time through
:func:`with_attention_moves`) and written in the plan (``Group.attention_moves``); a plan's
moves are priced as they are (:func:`apply_moves`), whatever this cost model would choose.

Memory: the light rank holds one layer's shipped KV block (and in backward its gradient) at
a time, freed after that layer's attention. It is not added to the memory walk (what the
runtime holds: docs/architecture.md, simulator); the stats
report the largest block (``block_bytes``). Measured on the slimpipe-mfu points (llama-70b,
H800): 0.75 GiB at 512K (tp2 cp8 pp4 vpp5; peak 70.9 GiB, so block plus its gradient still
fit the 73.6 GiB usable) and 0.50 GiB at 2048K (peak 50.1 GiB).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

from slimpack.cost.cp_sharding import shard_pieces
from slimpack.cost.kernels import ATTN_TILE
from slimpack.cost.memory import kv_bytes_per_token_per_layer
from slimpack.cost.model import CostModel
from slimpack.plan import Group, Move, Plan, PlanError, Unit, shipped_tokens
from slimpack.schedules import Op, build_schedule
from slimpack.schedules.ops import op_arrays
from slimpack.schedules.validate import walk_op_arrays
from slimpack.sim.costs import (
    BF16,
    GroupCosts,
    SliceShards,
    cp_ring_intra_node,
    group_costs,
    ring_step_seconds,
    unit_rank_sums,
)
from slimpack.specs.model import ModelSpec

FP32 = 4
MAX_TRANSFER_SHARE = 0.5
"""A pair moves only if its exposed transfer is at most this share of the attention time it
takes off the heavy rank (*reconstructed* threshold). The tick pairing only approximates
which ops overlap, so a move whose traffic eats most of its gain can lengthen the step.
Measured on llama-70b, H800, step change with redistribution at thresholds 0.25 / 0.5 / none:
two 512K samples, tp8 pp16, 32 slices: -9.5% / -11.1% / -10.8%; Common Crawl 256K, 16M
tokens, tp2 cp4 pp16 vpp5, 32 slices: 0.00% / +0.04% / +0.69%; Common Crawl 256K, 134M
tokens, tp8 pp4 dp8, 4 slices, offload: -0.55% / -0.22% / -0.13%."""

Pieces = tuple[tuple[int, int], ...]
RankPieces = tuple[Pieces, ...]
RingStep = Callable[[int], float]
"""A rank's token count -> one layer's ring-attention K/V step (seconds)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PairMove:
    """The effect of pairing one heavy op with one light op (seconds of the whole op: all its
    layers)."""

    heavy_delta_s: float
    """Change of the heavy op's duration (< 0), transfers included."""
    light_delta_s: float
    """Change of the light op's duration (> 0), transfers included."""
    moved_s: float
    """Attention seconds taken off the heavy op, per GPU (mean over its CP ranks: the work,
    not the change of the slowest rank's time)."""
    added_s: float
    """Seconds the shipped blocks cost on the light op, per GPU (same mean)."""
    transfer_s: float
    """Exposed transfer seconds of the heavy op's layers (each op is charged its own)."""
    fraction: float
    """Share of each segment's KV prefix shipped."""
    block_bytes: float = 0.0
    """KV block one light GPU holds for one layer (the largest over its CP ranks)."""


NO_MOVE = PairMove(heavy_delta_s=0.0, light_delta_s=0.0, moved_s=0.0, added_s=0.0,
                   transfer_s=0.0, fraction=0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class RedistributionStats:
    """What redistribution did to one group (seconds summed over the group's ops)."""

    pairs: int
    block_bytes: float
    """Largest KV block a light GPU holds at once (one layer's)."""
    moved_s: float
    added_s: float
    transfer_s: float
    fwd_imbalance_before: float
    """Over the forward ticks: sum of the slowest op's time / sum of the mean op time."""
    fwd_imbalance_after: float
    bwd_imbalance_before: float
    bwd_imbalance_after: float

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def schedule_ticks(ops: Sequence[Sequence[Op]], *, pp: int, vpp: int) -> list[list[int]]:
    """Start tick of every op (``[stage][position]``) with unit-time ops and free transfers
    (:func:`~slimpack.schedules.validate.unit_time_walk`, the timing walk's dependencies)."""
    ticks, stage_first = _flat_ticks(ops, pp=pp, vpp=vpp)
    return [ticks[a:b].tolist() for a, b in zip(stage_first[:-1], stage_first[1:], strict=True)]


def _flat_ticks(ops: Sequence[Sequence[Op]], *, pp: int,
                vpp: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`schedule_ticks` flat in stage order, and each stage's first index and one past
    the last."""
    ran, ticks, stage_first = walk_op_arrays([op_arrays(stage_ops) for stage_ops in ops],
                                             pp=pp, vpp=vpp)
    if any(int(ran[s]) < len(ops[s]) for s in range(pp)):
        raise ValueError("schedule_ticks: the op lists cannot complete (deadlock)")
    return ticks, stage_first


def _shrink(pieces: Pieces, fraction: float) -> tuple[Pieces, Pieces]:
    """(the heavy rank's pieces after shipping ``fraction`` of each prefix, the shipped blocks
    as (query tokens, KV tokens)); KV is cut in whole tiles."""
    kept, shipped = [], []
    for q, p in pieces:
        d = shipped_tokens(p, fraction)
        kept.append((q, p - d))
        if d > 0:
            shipped.append((q, d))
    return tuple(kept), tuple(shipped)


class _Shipped(NamedTuple):
    """What one CP rank of a heavy op ships at one share."""

    queries: int
    """Query tokens of the shipped blocks."""
    kv_tokens: int
    """KV tokens shipped."""
    seconds: float
    """The query-by-KV rectangles' time alone (:meth:`_Pricer.block`), in the pair's pass."""


class _Rank:
    """One CP rank of a heavy op: its pieces with a KV prefix and their time in the pair's
    pass."""

    __slots__ = ("pieces", "seconds", "_sums")

    def __init__(self, pieces: Pieces, seconds: float) -> None:
        self.pieces, self.seconds = pieces, seconds
        self._sums: tuple[tuple[tuple[int, int, int, int], ...], int, int, int] | None = None

    def sums(self) -> tuple[tuple[tuple[int, int, int, int], ...], int, int, int]:
        """(per piece (tokens, prefix, query tiles, diagonal tiles), and the totals that
        shipping does not change: tokens, query tiles, diagonal tiles)."""
        if self._sums is None:
            rows = []
            for q, p in self.pieces:
                nq = -(-q // ATTN_TILE)  # 0 for a piece without queries: no attention
                rows.append((q, p, nq, nq * (nq + 1) // 2))
            self._sums = (tuple(rows), sum(r[0] for r in rows), sum(r[2] for r in rows),
                          sum(r[3] for r in rows))
        return self._sums


class _Pricer:
    """Per-layer pass times through the cost model, cached (fixed-length samples repeat the
    same slices in every micro-batch).

    A shortened rank and its shipped blocks are priced from their attention sums (tokens,
    key tiles visited, query tiles: :func:`~slimpack.cost.kernels.attention_work`'s) where
    the cost model prices those (``layer_times_of_sums``, the kernel-level model with fused
    attention): the same seconds as ``layer_times`` of the pieces, without building and
    hashing ~10^6 one-use piece tuples per search. Other models are given the pieces."""

    def __init__(self, cost: CostModel, *, tp: int, recompute: str) -> None:
        self.cost, self.tp, self.recompute = cost, tp, recompute
        self._cache: dict[Pieces, tuple[float, float]] = {}
        self._blocks: dict[tuple[Pieces, bool], float] = {}
        self._sums: dict[tuple[int, int, int], tuple[float, float]] = {}
        # By the pieces object (kept in the value, so its id stays its own): the moves search
        # passes each distinct unit's pieces as one shared tuple, paired many times.
        self._ranks: dict[tuple[int, bool], tuple[RankPieces, list[_Rank]]] = {}
        self._compute: dict[tuple[int, bool], tuple[RankPieces, float, int]] = {}
        of_sums = getattr(cost, "layer_times_of_sums", None)
        self._of_sums = (of_sums if of_sums is not None
                         and of_sums(0, 0, 0, tp=tp, recompute=recompute) is not None else None)

    def times(self, pieces: Pieces) -> tuple[float, float]:
        got = self._cache.get(pieces)
        if got is None:
            t = self.cost.layer_times(list(pieces), tp=self.tp, recompute=self.recompute)
            got = (t.forward_s, t.backward_s)
            self._cache[pieces] = got
        return got

    def block(self, shipped: Pieces, backward: bool) -> float:
        """The query-by-KV rectangles alone: with and without their prefix."""
        if not shipped:
            return 0.0
        got = self._blocks.get((shipped, backward))
        if got is None:
            k = 1 if backward else 0
            got = self._blocks[(shipped, backward)] = (
                self.times(shipped)[k] - self.times(tuple((q, 0) for q, _ in shipped))[k])
        return got

    def heavy_ranks(self, heavy: RankPieces, backward: bool) -> list[_Rank]:
        """Per CP rank of a heavy op, its pieces with a KV prefix (the only ones shipping
        changes) and their time in the pass."""
        got = self._ranks.get((id(heavy), backward))
        if got is None:
            k = 1 if backward else 0
            ranks = []
            for hr in heavy:
                prefixed = tuple(p for p in hr if p[1] > 0)
                ranks.append(_Rank(prefixed, self.times(prefixed)[k] if prefixed else 0.0))
            got = self._ranks[(id(heavy), backward)] = (heavy, ranks)
        return got[1]

    def slowest_rank(self, ranks: RankPieces, backward: bool) -> tuple[float, int]:
        """(the slowest CP rank's layer time in the pass, the most tokens a CP rank holds)."""
        got = self._compute.get((id(ranks), backward))
        if got is None:
            k = 1 if backward else 0
            got = self._compute[(id(ranks), backward)] = (
                ranks, max(self.times(tuple(r))[k] if r else 0.0 for r in ranks),
                max(sum(q for q, _ in r) for r in ranks))
        return got[1], got[2]

    def shrink(self, rank: _Rank, fraction: float, backward: bool) -> tuple[float, _Shipped]:
        """(the time of ``rank``'s prefixed pieces after shipping ``fraction`` of each KV
        prefix, what it ships)."""
        k = 1 if backward else 0
        if self._of_sums is None:
            kept, shipped = _shrink(rank.pieces, fraction)
            return ((self.times(kept)[k] if kept else 0.0),
                    _Shipped(sum(q for q, _ in shipped), sum(d for _, d in shipped),
                             self.block(shipped, backward)))
        rows, rank_tokens, rank_queries, kept_tiles = rank.sums()
        tokens = queries = tiles = diagonal = kv = 0
        # attention_work's tile rule (nq * ceil(prefix / tile) + the diagonal), piece by
        # piece: the kept prefix p - d on this rank, the shipped block d on the light one.
        for q, p, nq, tri in rows:
            d = shipped_tokens(p, fraction)
            kept_tiles += nq * -(-(p - d) // ATTN_TILE)
            if d > 0:
                tokens += q
                queries += nq
                tiles += nq * -(-d // ATTN_TILE) + tri
                diagonal += tri
                kv += d
        kept_s = self._summed(rank_tokens, kept_tiles, rank_queries)[k]
        block_s = (self._summed(tokens, tiles, queries)[k]
                   - self._summed(tokens, diagonal, queries)[k]) if tokens else 0.0
        return kept_s, _Shipped(tokens, kv, block_s)

    def _summed(self, tokens: int, tiles: int, queries: int) -> tuple[float, float]:
        key = (tokens, tiles, queries)
        got = self._sums.get(key)
        if got is None:
            t = self._of_sums(tokens, tiles, queries, tp=self.tp, recompute=self.recompute)
            got = self._sums[key] = (t.forward_s, t.backward_s)
        return got


def prefix_weight(ranks: RankPieces) -> int:
    """Query tokens times KV prefix, summed over pieces and CP ranks: the pairing key (for
    SlimPipe's one-document slices, its KV prefix)."""
    return sum(q * p for r in ranks for q, p in r)


class _Pair:
    """One (heavy, light) pair of ops priced at any shipped share: the arithmetic both
    :func:`pair_move` (which chooses the share) and :func:`price_pair` (a given share) run."""

    def __init__(self, heavy: RankPieces, light: RankPieces, *, heavy_s: float,
                 light_s: float, heavy_layers: int, light_layers: int, pricer: _Pricer,
                 backward: bool, model: ModelSpec, tp: int, comm_time,  # noqa: ANN001
                 ring_step: RingStep | None) -> None:
        self.k = 1 if backward else 0
        self.backward, self.pricer, self.comm_time = backward, pricer, comm_time
        self.h0, self.l0, self.nh, self.nl = heavy_s, light_s, heavy_layers, light_layers
        self.q_bytes = model.q_dim / tp * BF16
        self.lse_bytes = model.num_heads / tp * FP32
        self.kv_bytes = kv_bytes_per_token_per_layer(model, tp)
        self.heavy, self.light, self.ring_step = heavy, light, ring_step
        self._ranks: list[_Rank] | None = None
        self._floors: tuple[float, float, float, float] | None = None
        # The share search evaluates a few shares, some twice (the secant's candidates, then
        # the chosen one): each share's sides and each rank's shortened pieces are priced once.
        self._sides: dict[float, tuple[float, float, list[_Shipped]]] = {}
        self._shrunk: dict[tuple[int, float], tuple[float, _Shipped]] = {}

    @property
    def ranks(self) -> list[_Rank]:
        # Only pieces with a KV prefix change. Attention adds over the pieces of a varlen
        # launch (both cost models sum tile work), so each rank's change is priced on those
        # few pieces alone and added to the op's current duration. With CP the op changes by
        # its CP ranks' least favourable change (the smallest saving, the largest addition):
        # exact for cp = 1, conservative otherwise.
        if self._ranks is None:
            self._ranks = self.pricer.heavy_ranks(self.heavy, self.backward)
        return self._ranks

    def shrunk(self, rank: int, fraction: float) -> tuple[float, _Shipped]:
        """(time of CP rank ``rank``'s prefixed pieces after shipping, what it ships)."""
        key = (rank, fraction)
        got = self._shrunk.get(key)
        if got is None:
            got = self._shrunk[key] = self.pricer.shrink(self.ranks[rank], fraction,
                                                         self.backward)
        return got

    @property
    def floors(self) -> tuple[float, float, float, float]:
        """Per layer, (heavy compute, heavy ring steps, light compute, light ring steps): the
        two terms whose larger the simulator charged each op's layers
        (:func:`~slimpack.sim.costs.unit_layer_seconds`); compute is the slowest CP rank's."""
        if self._floors is None:
            steps = (2 if self.backward else 1) * (len(self.heavy) - 1)

            def terms(ranks: RankPieces) -> tuple[float, float]:
                compute, tokens = self.pricer.slowest_rank(ranks, self.backward)
                return compute, steps * self.ring_step(tokens)

            self._floors = (*terms(self.heavy), *terms(self.light))
        return self._floors

    def sides(self, fraction: float) -> tuple[float, float, list[_Shipped]]:
        """(heavy op's time, light op's time, shipped blocks per CP rank), transfers aside."""
        got = self._sides.get(fraction)
        if got is None:
            got = self._sides[fraction] = self._priced_sides(fraction)
        return got

    def _priced_sides(self, fraction: float) -> tuple[float, float, list[_Shipped]]:
        saved, extra = -float("inf"), 0.0
        blocks = []
        for r, rank in enumerate(self.ranks):
            kept_s, shipped = self.shrunk(r, fraction)
            saved = max(saved, kept_s - rank.seconds)
            extra = max(extra, shipped.seconds)
            blocks.append(shipped)
        h, l_ = self.h0 + self.nh * saved, self.l0 + self.nl * extra
        if self.ring_step is not None:
            # With CP a layer lasts as long as the longer of its compute and its ring's K/V
            # steps, which the shipped block does not shorten: attention taken off a layer
            # whose steps outlast it saves nothing, and attention added to one that waited
            # on its steps first fills that wait.
            heavy_c, heavy_r, light_c, light_r = self.floors
            if heavy_r > heavy_c + saved:
                h = self.h0 + self.nh * (heavy_r - max(heavy_c, heavy_r))
            if light_r > light_c:
                l_ = self.l0 + self.nl * (max(light_c + extra, light_r) - light_r)
        return h, l_, blocks

    def exposed(self, blocks: list[_Shipped]) -> tuple[float, float]:
        """(exposed transfer seconds per layer, largest KV block bytes a light GPU holds).
        The busiest CP rank's blocks set the pace (ranks of a stage send in parallel); the KV
        block overlaps the light rank's own per-layer pass."""
        light_layer_s = self.l0 / self.nl
        q_bytes, lse_bytes, comm_time = self.q_bytes, self.lse_bytes, self.comm_time
        exposed = held = 0.0
        for shipped in blocks:
            q = shipped.queries
            kv = shipped.kv_tokens * self.kv_bytes
            if q == 0:
                continue
            if self.backward:
                send = comm_time(q * (2 * q_bytes + lse_bytes))  # Q, dO, log-sum-exp
                back = comm_time(q * q_bytes + kv)  # dQ and the block's dK, dV
            else:
                send = comm_time(q * q_bytes)
                back = comm_time(q * (q_bytes + lse_bytes))  # partial output + log-sum-exp
            kv_wait = max(0.0, comm_time(kv) - light_layer_s) if kv else 0.0
            exposed = max(exposed, send + back + kv_wait)
            held = max(held, kv)
        return exposed, held

    def move(self, fraction: float, h: float, l_: float, blocks: list[_Shipped],
             exposed: float, held: float) -> PairMove:
        nh, nl = self.nh, self.nl
        cp = len(self.heavy)
        moved = sum(rank.seconds - self.shrunk(r, fraction)[0]
                    for r, rank in enumerate(self.ranks))
        added = sum(shipped.seconds for shipped in blocks)
        return PairMove(heavy_delta_s=max(h, l_) - self.h0 + nh * exposed,
                        light_delta_s=l_ - self.l0 + nl * exposed, moved_s=nh * moved / cp,
                        added_s=nl * added / cp, transfer_s=nh * exposed, fraction=fraction,
                        block_bytes=held)


def pair_move(heavy: RankPieces, light: RankPieces, *, heavy_s: float, light_s: float,
              heavy_layers: int, light_layers: int, pricer: _Pricer, backward: bool,
              model: ModelSpec, tp: int, comm_time,  # noqa: ANN001 - bytes -> s
              ring_step: RingStep | None = None) -> PairMove:
    """Balance one (heavy, light) pair of ops whose current durations are ``heavy_s`` and
    ``light_s`` (their layers, LM-head share and CP communication included);
    ``comm_time(bytes)`` prices one transfer and, with CP (ring attention),
    ``ring_step(rank tokens)`` one K/V step of a layer. The returned changes are whole-op
    seconds; :data:`NO_MOVE` when no share pays off."""
    h0, l0 = heavy_s, light_s
    if h0 <= l0:
        return NO_MOVE
    pair = _Pair(heavy, light, heavy_s=heavy_s, light_s=light_s, heavy_layers=heavy_layers,
                 light_layers=light_layers, pricer=pricer, backward=backward, model=model, tp=tp,
                 comm_time=comm_time, ring_step=ring_step)
    nh = heavy_layers
    # The pair can at best meet in the middle, moving (h0 - l0) / 2; the query's round trip
    # alone is a lower bound on the exposed transfer, so pairs that cannot pass the transfer
    # share skip the search.
    queries = max(sum(q for q, p in r if p > 0) for r in heavy)
    floor = _transfer_floor(queries, backward=backward, q_bytes=pair.q_bytes,
                            lse_bytes=pair.lse_bytes, comm_time=comm_time)
    if queries == 0 or MAX_TRANSFER_SHARE * (h0 - l0) / 2 < floor * nh:
        return NO_MOVE
    sides = pair.sides
    h1, l1, _ = sides(1.0)
    if h1 >= l1:
        best = 1.0
    else:
        # heavy - light is nearly linear in the fraction (tile work): interpolate, then one
        # secant step towards the side it landed on; keep the better of the two.
        g0, g1 = h0 - l0, h1 - l1
        first = g0 / (g0 - g1)
        h, l_, _ = sides(first)
        g = h - l_
        if g > 0 and g != g1:
            second = first + g / (g - g1) * (1.0 - first)
        elif g < 0 and g != g0:
            second = first * g0 / (g0 - g)
        else:
            second = first
        best = min((first, second), key=lambda f: max(sides(f)[:2]))
    h, l_, blocks = sides(best)
    if max(h, l_) >= h0:
        return NO_MOVE
    exposed, held = pair.exposed(blocks)
    if max(h, l_) + nh * exposed >= h0:
        # Short slices: shipping costs more than it saves, so the pair runs as it is.
        return NO_MOVE
    if nh * exposed > MAX_TRANSFER_SHARE * (h0 - h):
        return NO_MOVE
    return pair.move(best, h, l_, blocks, exposed, held)


def price_pair(heavy: RankPieces, light: RankPieces, *, fraction: float, heavy_s: float,
               light_s: float, heavy_layers: int, light_layers: int, pricer: _Pricer,
               backward: bool, model: ModelSpec, tp: int, comm_time,  # noqa: ANN001
               ring_step: RingStep | None = None) -> PairMove:
    """The change of a pair of ops that ships ``fraction`` of the heavy op's KV prefixes (a
    plan's move: priced as it is, whether or not it pays off under these prices). At the
    share :func:`pair_move` chose, the same numbers it returned."""
    pair = _Pair(heavy, light, heavy_s=heavy_s, light_s=light_s, heavy_layers=heavy_layers,
                 light_layers=light_layers, pricer=pricer, backward=backward, model=model, tp=tp,
                 comm_time=comm_time, ring_step=ring_step)
    h, l_, blocks = pair.sides(fraction)
    exposed, held = pair.exposed(blocks)
    return pair.move(fraction, h, l_, blocks, exposed, held)


def _unit_pieces(group: Group, unit: Unit, slice_cache: dict,
                 sharded: SliceShards | None = None) -> RankPieces:
    """Per-CP-rank (tokens, prefix) tuples of a unit; ``slice_cache`` is this module's own
    (the simulator's pricing keeps its shards as arrays: ``sharded``, where given, is read
    instead of sharding each slice again)."""
    per_rank: list[list[tuple[int, int]]] = [[] for _ in range(group.cp)]
    for sid in unit.slice_ids:
        key = (group.group_id, sid)
        shards = slice_cache.get(key)
        if shards is None:
            shards = (sharded.rank_pieces(sid) if sharded is not None else
                      shard_pieces([(seg.num_tokens, seg.start)
                                    for seg in group.slice(sid).segments],
                                   group.cp, group.cp_sharding))
            slice_cache[key] = shards
        for r in range(group.cp):
            per_rank[r].extend(shards[r])
    return tuple(tuple(r) for r in per_rank)


def _transfer_floor(queries: int, *, backward: bool, q_bytes: float, lse_bytes: float,
                    comm_time) -> float:  # noqa: ANN001 - bytes -> s
    """Per layer, the query's round trip alone (forward: query out, partial output and
    log-sum-exp back; backward: query, output gradient and log-sum-exp out, dQ back): a lower
    bound on a pair's exposed transfer whatever share of the prefix it ships."""
    if backward:
        return comm_time(queries * (2 * q_bytes + lse_bytes)) + comm_time(queries * q_bytes)
    return comm_time(queries * q_bytes) + comm_time(queries * (q_bytes + lse_bytes))


@dataclass(frozen=True, slots=True)
class _OpTable:
    """Every op of a group's schedule as parallel arrays, sorted by (tick, backward, pairing
    key descending, virtual stage, unit): each concurrent set is one contiguous run, its ops
    in pairing order."""

    tick: np.ndarray
    backward: np.ndarray
    vs: np.ndarray
    unit: np.ndarray
    flat: np.ndarray
    """Position of each op in the stage-major listing of the schedule."""
    set_start: np.ndarray
    """Index where each (tick, backward) set starts."""


def _op_table(ops: Sequence[Sequence[Op]], *, pp: int, vpp: int, fwd_weight: np.ndarray,
              bwd_weight: np.ndarray) -> _OpTable:
    total = sum(map(len, ops))
    arrays = [op_arrays(stage_ops) for stage_ops in ops]
    tick, _ = _flat_ticks(ops, pp=pp, vpp=vpp)
    backward = ~np.concatenate([a[0] for a in arrays]) if total else np.zeros(0, dtype=bool)
    unit = np.concatenate([a[1] for a in arrays]) if total else np.zeros(0, dtype=np.int64)
    stage = np.repeat(np.arange(pp, dtype=np.int64), [len(o) for o in ops])
    vs = (np.concatenate([a[2] for a in arrays]) if total else
          np.zeros(0, dtype=np.int64)) * pp + stage
    weight = _by_kind(backward, unit, fwd_weight, bwd_weight)
    order = np.lexsort((unit, vs, -weight, backward, tick))
    tick, backward, vs, unit = tick[order], backward[order], vs[order], unit[order]
    new_set = np.r_[True, (tick[1:] != tick[:-1]) | (backward[1:] != backward[:-1])]
    return _OpTable(tick=tick, backward=backward, vs=vs, unit=unit, flat=order,
                    set_start=np.flatnonzero(new_set))


def _by_kind(backward: np.ndarray, unit: np.ndarray, fwd_values: np.ndarray,
             bwd_values: np.ndarray) -> np.ndarray:
    """Per op, the value of its unit: forward units index ``fwd_values``, backward units
    ``bwd_values``."""
    out = np.empty(len(unit), dtype=fwd_values.dtype)
    out[~backward] = fwd_values[unit[~backward]]
    out[backward] = bwd_values[unit[backward]]
    return out


def _imbalance(table: _OpTable, times: np.ndarray, backward: bool) -> float:
    """Over the concurrent sets of one kind with more than one op: the sum of each set's
    slowest op / the sum of its mean op (the sets in the order they first appear in the
    stage-major listing, each set's ops in listing order, as Python sums them)."""
    sizes = np.diff(np.append(table.set_start, len(table.tick)))
    keep = (sizes > 1) & (table.backward[table.set_start] == backward)
    starts, sizes = table.set_start[keep], sizes[keep]
    if not len(starts):
        return 1.0
    member = np.repeat(starts, sizes) + _ranks_within(sizes)
    # Listing order inside each set and between sets (by the set's first op).
    first_flat = np.minimum.reduceat(table.flat[member], np.cumsum(sizes) - sizes)
    set_rank = np.empty(len(starts), dtype=np.int64)
    set_rank[np.argsort(first_flat, kind="stable")] = np.arange(len(starts))
    order = np.lexsort((table.flat[member], np.repeat(set_rank, sizes)))
    member_times = times[member[order]]
    bounds = np.cumsum(np.append(0, sizes[np.argsort(first_flat, kind="stable")]))
    slowest, mean = _slowest_and_mean(member_times, bounds)
    return slowest / mean if mean > 0 else 1.0


@numba.njit(cache=True, nogil=True)
def _slowest_and_mean(times: np.ndarray, bounds: np.ndarray) -> tuple[float, float]:
    """Over the runs ``times[bounds[k]:bounds[k+1]]``: the sum of each run's largest and the
    sum of each run's mean, each run summed left to right and the runs added in order (the
    loop written in Python, compiled: ~10^5 sets per group, four times per redistribution)."""
    slowest = 0.0
    mean = 0.0
    for k in range(len(bounds) - 1):
        a, b = bounds[k], bounds[k + 1]
        largest = times[a]
        total = 0.0
        for i in range(a, b):
            if times[i] > largest:
                largest = times[i]
            total += times[i]
        slowest += largest
        mean += total / (b - a)
    return slowest, mean


def _max_per_run(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The largest of ``values`` in each run beginning at ``starts`` (non-empty runs)."""
    if not len(starts):
        return np.zeros(0, dtype=values.dtype)
    return np.maximum.reduceat(values, starts)


def _ranks_within(sizes: np.ndarray) -> np.ndarray:
    """0, 1, ..., size-1 for each run of ``sizes``, concatenated."""
    total = int(sizes.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)


def group_moves(group: Group, ops: Sequence[Sequence[Op]], costs: GroupCosts, *,
                model: ModelSpec, cost: CostModel, gpus_per_node: int,
                shards: SliceShards | None = None,
                ) -> tuple[GroupCosts, RedistributionStats, tuple[Move, ...]]:
    """``costs`` with attention moved between concurrent ops of paired pipeline ranks, the
    stats, and the moves themselves (in the order their prices were applied). ``shards``:
    the group's slices as ``group_costs`` sharded them, where the caller kept them."""
    table, times, applied = _chosen(group, ops, costs, model=model, cost=cost,
                                    gpus_per_node=gpus_per_node, shards=shards)
    after, stats = _applied(group, costs, table, times, applied)
    return after, stats, tuple(m for m, _ in applied)


def _chosen(group: Group, ops: Sequence[Sequence[Op]], costs: GroupCosts, *,
            model: ModelSpec, cost: CostModel, gpus_per_node: int,
            shards: SliceShards | None = None,
            ) -> tuple[_OpTable, np.ndarray, list[tuple[Move, PairMove]]]:
    """The op table, every op's time under ``costs``, and the moves :func:`group_moves`
    applies with their prices (in the order they are applied).

    Every op of the schedule lies in exactly one tick, so each tick's moves read prices no
    other tick changes: the pairing and the cheap necessary conditions of :func:`pair_move`
    (the heavy op slower, its query round trip within the transfer share) run on arrays over
    all ops at once, and only the pairs that pass are balanced one by one.
    """
    pp, tp = group.pp, group.tp
    slice_cache: dict = {}
    shards = shards if shards is not None else SliceShards(group)
    (fwd_weight, fwd_queries), (bwd_weight, bwd_queries) = _unit_keys(group, shards)
    table = _op_table(ops, pp=pp, vpp=group.vpp, fwd_weight=fwd_weight, bwd_weight=bwd_weight)
    times = _op_times(table, costs, group)
    # Pairs: in each set, the a-th heaviest with the a-th lightest.
    sizes = np.diff(np.append(table.set_start, len(table.tick)))
    within = _ranks_within(sizes)
    set_of = np.repeat(np.arange(len(sizes)), sizes)
    heavy = np.flatnonzero(within < sizes[set_of] // 2)
    light = table.set_start[set_of[heavy]] + sizes[set_of[heavy]] - 1 - within[heavy]
    layers = np.array(costs.layers, dtype=np.int64)
    h0, l0 = times[heavy], times[light]
    nh = layers[table.vs[heavy]]
    is_b = table.backward[heavy]
    queries = _by_kind(is_b, table.unit[heavy], fwd_queries, bwd_queries)
    intra_of = _intra_node_stages(group, gpus_per_node)
    intra = intra_of[table.vs[heavy] % pp, table.vs[light] % pp]
    q_bytes = model.q_dim / tp * BF16
    lse_bytes = model.num_heads / tp * FP32

    def comm(intra_node: bool):  # noqa: ANN202
        return _p2p(cost, intra_node)

    # pair_move's first two refusals, on every pair at once (the same float operations).
    # One floor per distinct (queries, backward, intra-node) of the pairs whose heavy op is
    # slower: pairs repeat few of them.
    floor = np.zeros(len(heavy), dtype=np.float64)
    slower = np.flatnonzero(h0 > l0)
    if len(slower):
        # (queries, backward, intra-node) as one int: a 1-D unique (the row-wise one sorts
        # rows as bytes, ~20x slower on 10^6 pairs).
        kinds, kind_of = np.unique(queries[slower] * 4 + is_b[slower] * 2 + intra[slower],
                                   return_inverse=True)
        floor[slower] = np.array([_transfer_floor(k >> 2, backward=bool(k & 2),
                                                  q_bytes=q_bytes, lse_bytes=lse_bytes,
                                                  comm_time=comm(bool(k & 1)))
                                  for k in kinds.tolist()])[kind_of]
    viable = (h0 > l0) & (queries > 0) & ~(MAX_TRANSFER_SHARE * (h0 - l0) / 2 < floor * nh)
    # A tick keeps its moves only if its slowest op gets faster, and only viable heavy ops
    # can get faster (light ops only slow down): a tick whose slowest viable heavy op is no
    # slower than every other op's current time keeps nothing, so its pairs are not priced.
    may_shrink = np.zeros(len(times), dtype=bool)
    may_shrink[heavy[viable]] = True
    tick_start = table.set_start[np.r_[True, table.tick[table.set_start[1:]]
                                       != table.tick[table.set_start[:-1]]]]
    tick_of = np.repeat(np.arange(len(tick_start)),
                        np.diff(np.append(tick_start, len(times))))
    fixed_max = _max_per_run(np.where(may_shrink, -np.inf, times), tick_start)
    shrink_max = _max_per_run(np.where(may_shrink, times, -np.inf), tick_start)
    viable &= (shrink_max > fixed_max)[tick_of[heavy]]

    pieces_of: dict[tuple[bool, int], tuple[int, RankPieces]] = {}
    interned: dict[RankPieces, tuple[int, RankPieces]] = {}

    def pieces(backward: bool, u: int) -> tuple[int, RankPieces]:
        """(an id equal for equal pieces, the unit's pieces, one object for equal pieces):
        samples repeat slices, a small int hashes faster than the pieces in the moves
        cache's keys, and the pricer keeps each unit's per-rank work by its object."""
        got = pieces_of.get((backward, u))
        if got is None:
            units = group.backward_units if backward else group.forward_units
            ranks = _unit_pieces(group, units[u], slice_cache, shards)
            got = interned.get(ranks)
            if got is None:
                got = interned[ranks] = (len(interned), ranks)
            pieces_of[(backward, u)] = got
        return got

    pricer = _Pricer(cost, tp=tp, recompute=group.recompute)
    ring_step = _ring_step(group, model=model, cost=cost, gpus_per_node=gpus_per_node)
    moves: dict[tuple, PairMove] = {}

    def move_of(backward: bool, heavy_op: tuple[int, int, float], light_op: tuple[int, int, float],
                intra_node: bool) -> PairMove:
        (hvs, hu, h_s), (lvs, lu, l_s) = heavy_op, light_op
        n_h, n_l = costs.layers[hvs], costs.layers[lvs]
        (h_id, h_pieces), (l_id, l_pieces) = pieces(backward, hu), pieces(backward, lu)
        key = (backward, h_id, l_id, intra_node, h_s, l_s, n_h, n_l)
        move = moves.get(key)
        if move is None:
            move = moves[key] = pair_move(
                h_pieces, l_pieces, heavy_s=h_s, light_s=l_s, heavy_layers=n_h,
                light_layers=n_l, pricer=pricer, backward=backward, model=model, tp=tp,
                comm_time=comm(intra_node), ring_step=ring_step)
        return move

    applied: list[tuple[Move, PairMove]] = []
    # The ops of a tick run side by side, so the tick lasts as long as its slowest op
    # (forward or backward). Moves that do not shorten it only add transfers: keep the tick's
    # moves only if its slowest op gets faster (*reconstructed* rule: a runtime would decide
    # from a profile which pairs to exchange). Pairs are priced slowest heavy op first, and
    # a tick is given up as soon as some op is sure to stay at least as slow as the slowest.
    cand = np.flatnonzero(viable)
    cand_tick = tick_of[heavy[cand]]
    cand = cand[np.lexsort((cand, -h0[cand], cand_tick))]
    cand_tick = tick_of[heavy[cand]]
    run_start = np.flatnonzero(np.r_[True, cand_tick[1:] != cand_tick[:-1]])[:len(cand)]
    run_end = np.append(run_start[1:], len(cand))[:len(run_start)]
    # Plain lists per candidate pair: the loop below reads them one by one.
    order = cand.tolist()
    k_tick = table.tick[heavy[cand]].tolist()
    backward_of = is_b[cand].tolist()
    intra_of_pair = intra[cand].tolist()
    heavy_ops = list(zip(table.vs[heavy[cand]].tolist(), table.unit[heavy[cand]].tolist(),
                         h0[cand].tolist(), strict=True))
    light_ops = list(zip(table.vs[light[cand]].tolist(), table.unit[light[cand]].tolist(),
                         l0[cand].tolist(), strict=True))
    for a, b, k in zip(run_start.tolist(), run_end.tolist(), cand_tick[run_start].tolist(),
                       strict=True):
        slowest = float(shrink_max[k])
        bound = float(fixed_max[k])
        proposed = []
        for j in range(a, b):
            move = move_of(backward_of[j], heavy_ops[j], light_ops[j], intra_of_pair[j])
            if move is NO_MOVE:
                bound = max(bound, heavy_ops[j][2])
            else:
                new_h = heavy_ops[j][2] + move.heavy_delta_s
                new_l = light_ops[j][2] + move.light_delta_s
                bound = max(bound, new_h, new_l)
                proposed.append((order[j], j, move))
            if bound >= slowest:
                break
        if bound >= slowest:
            continue
        proposed.sort(key=lambda p: p[0])  # the pairs' own order, for the sums below
        for _, j, move in proposed:
            applied.append((Move(backward=backward_of[j], tick=int(k_tick[j]),
                                 heavy_block=heavy_ops[j][0], heavy_unit=heavy_ops[j][1],
                                 light_block=light_ops[j][0], light_unit=light_ops[j][1],
                                 fraction=move.fraction), move))
    return table, times, applied


def apply_moves(group: Group, ops: Sequence[Sequence[Op]], costs: GroupCosts,
                moves: Sequence[Move], *, model: ModelSpec, cost: CostModel,
                gpus_per_node: int, shards: SliceShards | None = None,
                ) -> tuple[GroupCosts, RedistributionStats]:
    """``costs`` with the given ``moves`` priced under ``cost`` (a plan's
    ``Group.attention_moves``: priced as they are, not chosen again, even where this cost
    model would choose others), and the stats. Moves :func:`group_moves` chose under the same
    prices give its numbers bit for bit. Raises PlanError for a move whose ops do not run at
    its tick in ``ops``."""
    pp = group.pp
    shards = shards if shards is not None else SliceShards(group)
    (fwd_weight, _), (bwd_weight, _) = _unit_keys(group, shards)
    table = _op_table(ops, pp=pp, vpp=group.vpp, fwd_weight=fwd_weight, bwd_weight=bwd_weight)
    times = _op_times(table, costs, group)
    _check_ticks(group, table, moves)
    intra_of = _intra_node_stages(group, gpus_per_node)
    pricer = _Pricer(cost, tp=group.tp, recompute=group.recompute)
    ring_step = _ring_step(group, model=model, cost=cost, gpus_per_node=gpus_per_node)
    slice_cache: dict = {}
    applied = []
    for m in moves:
        before = costs.bwd_s if m.backward else costs.fwd_s
        units = group.backward_units if m.backward else group.forward_units
        move = price_pair(_unit_pieces(group, units[m.heavy_unit], slice_cache, shards),
                          _unit_pieces(group, units[m.light_unit], slice_cache, shards),
                          fraction=m.fraction, heavy_s=float(before[m.heavy_block][m.heavy_unit]),
                          light_s=float(before[m.light_block][m.light_unit]),
                          heavy_layers=costs.layers[m.heavy_block],
                          light_layers=costs.layers[m.light_block], pricer=pricer,
                          backward=m.backward, model=model, tp=group.tp,
                          comm_time=_p2p(cost, bool(intra_of[m.heavy_block % pp,
                                                             m.light_block % pp])),
                          ring_step=ring_step)
        applied.append((m, move))
    return _applied(group, costs, table, times, applied)


def check_move_ticks(group: Group, ops: Sequence[Sequence[Op]], moves: Sequence[Move]) -> None:
    """Raise PlanError for a move whose two ops do not start at its tick when the group runs
    as ``ops`` (moves were chosen for one schedule; another pairs other ops)."""
    if moves:
        _check_ticks(group, _op_table(
            ops, pp=group.pp, vpp=group.vpp,
            fwd_weight=np.zeros(len(group.forward_units), dtype=np.int64),
            bwd_weight=np.zeros(len(group.backward_units), dtype=np.int64)), moves)


def _check_ticks(group: Group, table: _OpTable, moves: Sequence[Move]) -> None:
    if not moves:
        return
    # Each side's tick looked up by (backward, virtual stage, unit) in the ops' sorted keys:
    # ~10^4 moves against ~10^6 ops, without a Python object per op.
    blocks = group.pp * group.vpp
    units = int(table.unit.max()) + 1 if len(table.unit) else 0
    keys = (table.unit * blocks + table.vs) * 2 + table.backward
    order = np.argsort(keys, kind="stable")
    sorted_keys, sorted_ticks = keys[order], table.tick[order]
    backward = np.array([m.backward for m in moves], dtype=np.int64)
    tick = np.array([m.tick for m in moves], dtype=np.int64)
    wrong = {}
    for side in ("heavy", "light"):
        block = np.array([getattr(m, f"{side}_block") for m in moves], dtype=np.int64)
        unit = np.array([getattr(m, f"{side}_unit") for m in moves], dtype=np.int64)
        inside = (block >= 0) & (block < blocks) & (unit >= 0) & (unit < units)
        found = np.zeros(len(moves), dtype=bool)
        if len(sorted_keys):
            want = (unit * blocks + block) * 2 + backward
            at = np.minimum(np.searchsorted(sorted_keys, want), len(sorted_keys) - 1)
            found = inside & (sorted_keys[at] == want) & (sorted_ticks[at] == tick)
        wrong[side] = ~found
    bad = np.flatnonzero(wrong["heavy"] | wrong["light"])
    if len(bad):
        i = int(bad[0])
        side = "heavy" if wrong["heavy"][i] else "light"
        block, unit = getattr(moves[i], f"{side}_block"), getattr(moves[i], f"{side}_unit")
        raise PlanError(f"Group {group.group_id}: attention_moves[{i}]: its {side} op "
                        f"(block {block}, unit {unit}) does not start at tick {moves[i].tick} "
                        f"of the group's schedule")


def _applied(group: Group, costs: GroupCosts, table: _OpTable, times: np.ndarray,
             applied: Sequence[tuple[Move, PairMove]]) -> tuple[GroupCosts, RedistributionStats]:
    """``costs`` with each move's priced change added to its two ops (each op is in at most
    one move, so every change reads the op's time before any move), and the stats (sums in
    the moves' order)."""
    fwd_s = [list(row) for row in costs.fwd_s]
    bwd_s = [list(row) for row in costs.bwd_s]
    moved = added = transfer = held = 0.0
    for m, move in applied:
        times_of = bwd_s if m.backward else fwd_s
        h0 = times_of[m.heavy_block][m.heavy_unit]
        l0 = times_of[m.light_block][m.light_unit]
        times_of[m.heavy_block][m.heavy_unit] = h0 + move.heavy_delta_s
        times_of[m.light_block][m.light_unit] = l0 + move.light_delta_s
        moved += move.moved_s
        added += move.added_s
        transfer += move.transfer_s
        held = max(held, move.block_bytes)
    after = dataclasses.replace(costs, fwd_s=fwd_s, bwd_s=bwd_s)
    after_times = _op_times(table, after, group)
    stats = RedistributionStats(
        pairs=len(applied), block_bytes=held, moved_s=moved, added_s=added, transfer_s=transfer,
        fwd_imbalance_before=_imbalance(table, times, False),
        fwd_imbalance_after=_imbalance(table, after_times, False),
        bwd_imbalance_before=_imbalance(table, times, True),
        bwd_imbalance_after=_imbalance(table, after_times, True))
    return after, stats


def _unit_keys(group: Group, shards: SliceShards | None = None,
               ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Per forward and per backward unit: :func:`prefix_weight` of its pieces, and its
    busiest CP rank's query tokens that have a KV prefix."""
    def keys(units: Sequence[Unit]) -> tuple[np.ndarray, np.ndarray]:
        if not units:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        sums = unit_rank_sums(group, units, lambda q, p: [q * p, np.where(p > 0, q, 0)],
                              shards)
        return sums[0].sum(axis=1), sums[1].max(axis=1)

    fwd = keys(group.forward_units)
    same = group.backward_units == group.forward_units
    return fwd, (fwd if same else keys(group.backward_units))


def _op_times(table: _OpTable, costs: GroupCosts, group: Group) -> np.ndarray:
    """Every op's duration under ``costs``, in the table's order."""
    blocks = group.pp * group.vpp
    fwd = np.array(costs.fwd_s, dtype=np.float64).reshape(blocks, -1)
    bwd = np.array(costs.bwd_s, dtype=np.float64).reshape(blocks, -1)
    out = np.empty(len(table.tick), dtype=np.float64)
    b = table.backward
    out[~b] = fwd[table.vs[~b], table.unit[~b]] if fwd.size else 0.0
    out[b] = bwd[table.vs[b], table.unit[b]] if bwd.size else 0.0
    return out


def _intra_node_stages(group: Group, gpus_per_node: int) -> np.ndarray:
    """``[a, b]``: stages a and b of the group lie on one node (their link is intra-node)."""
    pp = group.pp
    stage_nodes = [{r // gpus_per_node for r in group.stage_ranks(s)} for s in range(pp)]
    return np.array([[len(stage_nodes[a] | stage_nodes[b]) == 1 for b in range(pp)]
                     for a in range(pp)], dtype=bool)


def _p2p(cost: CostModel, intra_node: bool):  # noqa: ANN202 - bytes -> s
    return lambda b: cost.comm.p2p(b, intra_node=intra_node)


def _ring_step(group: Group, *, model: ModelSpec, cost: CostModel,
               gpus_per_node: int) -> RingStep | None:
    """One layer's K/V ring step for a rank's token count, as the simulator prices it
    (``None`` without a ring: cp 1, or Ulysses, whose all-to-alls are not a floor under the
    shipped attention)."""
    if group.cp == 1 or group.cp_kind != "ring":
        return None
    cp_intra = cp_ring_intra_node(group, gpus_per_node)
    return lambda tokens: ring_step_seconds(cost, model, tp=group.tp, rank_tokens=tokens,
                                            cp_intra=cp_intra)


def priced_moves(group: Group, ops: Sequence[Sequence[Op]], *, model: ModelSpec,
                 cost: CostModel, gpus_per_node: int) -> tuple[Move, ...]:
    """The moves :func:`~slimpack.sim.simulate.simulate` applies to ``group`` run as ``ops``
    under ``cost`` (the group priced as the simulator prices it): what the runtime executes."""
    shards = SliceShards(group)
    costs = group_costs(group, model=model, cost=cost, gpus_per_node=gpus_per_node,
                        shards=shards)
    # The moves alone: the costs after them and the stats are the simulator's to compute.
    _, _, applied = _chosen(group, ops, costs, model=model, cost=cost,
                            gpus_per_node=gpus_per_node, shards=shards)
    return tuple(m for m, _ in applied)


@dataclass(frozen=True, kw_only=True, slots=True)
class PricedGroup:
    """A group whose attention moves :func:`with_attention_moves` chose, priced as the
    simulator prices it: what :func:`~slimpack.sim.simulate.simulate` takes instead of
    building its schedule, pricing its units and applying its moves again (the same
    numbers: moves :func:`group_moves` chose give :func:`apply_moves` its prices bit for
    bit). Kept only for the very group object of the plan and the very cost model."""

    group: Group
    """The plan's group, moves included (reused only for this object); in
    ``SimResult.chosen_moves``, the group simulated without moves."""
    moves: tuple[Move, ...]
    """The moves priced (the group's ``attention_moves`` once it carries them)."""
    cost: CostModel
    ops: Sequence[Sequence[Op]]
    """The op lists the moves were chosen on (:func:`~slimpack.schedules.build_schedule`'s,
    which do not depend on the moves)."""
    costs: GroupCosts
    """The group's unit prices with its moves applied."""
    stats: RedistributionStats


def merge_stats(stats: Sequence[RedistributionStats]) -> dict[str, float]:
    """One record's view: sums, and the imbalances of the group that moved most."""
    if not stats:
        return {}
    top = max(stats, key=lambda s: s.moved_s)
    return {"pairs": sum(s.pairs for s in stats), "moved_s": sum(s.moved_s for s in stats),
            "added_s": sum(s.added_s for s in stats),
            "transfer_s": sum(s.transfer_s for s in stats),
            "block_bytes": max(s.block_bytes for s in stats),
            "fwd_imbalance_before": top.fwd_imbalance_before,
            "fwd_imbalance_after": top.fwd_imbalance_after,
            "bwd_imbalance_before": top.bwd_imbalance_before,
            "bwd_imbalance_after": top.bwd_imbalance_after}


def with_attention_moves(plan: Plan, *, model: ModelSpec, cost: CostModel,
                         schedules: Mapping[int, Sequence[Sequence[Op]]] | None = None,
                         chosen: Mapping[int, PricedGroup] | None = None,
                         priced: dict[int, PricedGroup] | None = None) -> Plan:
    """``plan`` with every pp > 1 group's ``attention_moves`` chosen under ``cost``
    (:func:`priced_moves` on the simulator's schedule: ``schedules[group_id]`` where given,
    else :func:`~slimpack.schedules.build_schedule`) when ``attention_redistribution`` is on;
    the plan itself otherwise. What a planner that redistributes calls at plan time, so the
    plan carries what the simulator and the runtime execute.

    ``chosen``: ``SimResult.chosen_moves`` of a simulation under ``cost`` on the op lists
    used here (``schedules``, else :func:`~slimpack.schedules.build_schedule`'s); a group that
    is the very object simulated there (not one changed since, e.g. by a recompute
    escalation) takes those moves, the ones :func:`priced_moves` would choose again (and
    their prices, for ``priced``).

    ``priced``: where to leave a :class:`PricedGroup` (by group id) for every group whose
    moves are chosen here, for the simulation of the returned plan under ``cost`` that
    follows (``simulate(priced=...)``), so it does not price them a second time."""
    if not plan.attention_redistribution:
        return plan
    gpus = plan.parallel.gpus_per_node
    schedules = schedules or {}
    chosen = chosen or {}

    def with_moves(g: Group) -> Group:
        if g.pp == 1:
            return g
        simulated = chosen.get(g.group_id)
        if simulated is not None and simulated.group is g:
            moved = dataclasses.replace(g, attention_moves=simulated.moves)
            if priced is not None and simulated.cost is cost:
                priced[g.group_id] = dataclasses.replace(simulated, group=moved)
            return moved
        ops = schedules.get(g.group_id)
        ops = ops if ops is not None else build_schedule(g)
        if priced is None:
            return dataclasses.replace(g, attention_moves=priced_moves(
                g, ops, model=model, cost=cost, gpus_per_node=gpus))
        shards = SliceShards(g)
        costs = group_costs(g, model=model, cost=cost, gpus_per_node=gpus, shards=shards)
        after, stats, moves = group_moves(g, ops, costs, model=model, cost=cost,
                                          gpus_per_node=gpus, shards=shards)
        moved = dataclasses.replace(g, attention_moves=moves)
        priced[g.group_id] = PricedGroup(group=moved, moves=moves, cost=cost, ops=ops,
                                         costs=after, stats=stats)
        return moved

    phases = tuple(dataclasses.replace(phase, groups=tuple(map(with_moves, phase.groups)))
                   for phase in plan.phases)
    return dataclasses.replace(plan, phases=phases)
