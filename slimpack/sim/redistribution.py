"""SlimPipe's attention redistribution between pipeline ranks (arXiv 2504.14519).

Under slice-level 1F1B, later slices of a sample carry longer KV prefixes, so pipeline ranks
that run different slices at the same time do different amounts of attention. SlimPipe pairs
those ranks, longest KV prefix with shortest; the heavy rank ships its query and part of its
cached KV to the light one, which computes that block and returns partial outputs that are
merged with the log-sum-exp trick. This module moves that work between the two ops' durations
before the timing walk (:func:`redistribute_group`); everything else in the walk is unchanged.

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

Transfers, per layer, priced by the comm model on the link between the two stages
(*reconstructed* overlap): forward, the heavy rank sends its query and the KV block; the KV
is cached from earlier slices, so it can travel while the light rank computes its own
attention and is charged only where it is longer than that; the query exists only once the
layer's projection has run and the partial outputs (bf16 plus fp32 log-sum-exp per head) are
needed before the output projection, so both are exposed and charged to both ops (the heavy
one waits for the partials). Backward sends query, output gradient and log-sum-exp plus the
KV block, and returns dQ and the block's dK, dV.

Memory: the light rank holds one layer's shipped KV block (and in backward its gradient) at
a time, freed after that layer's attention. It is not added to the memory walk; the stats
report the largest block (``block_bytes``). Measured on the slimpipe-mfu points (llama-70b,
H800): 0.75 GiB at 512K (tp2 cp8 pp4 vpp5; peak 70.9 GiB, so block plus its gradient still
fit the 73.6 GiB usable) and 0.50 GiB at 2048K (peak 50.1 GiB).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from slimpack.cost.cp_sharding import shard_pieces
from slimpack.cost.memory import kv_bytes_per_token_per_layer
from slimpack.cost.model import CostModel
from slimpack.plan import Group, Unit
from slimpack.schedules import Op
from slimpack.sim.costs import BF16, GroupCosts
from slimpack.specs.model import ModelSpec

TILE = 128
"""KV is shipped in whole FlashAttention tiles."""
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
    """Largest KV block a light GPU holds at once (one layer's; not in the memory walk)."""
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
    """Start tick of every op (``[stage][position]``) with unit-time ops and free transfers.

    The same dependencies as the timing walk (:mod:`slimpack.sim.engine`): list order on a
    stage, F on virtual stage ``vs`` after F on ``vs - 1``, B on ``vs`` after B on ``vs + 1``.
    """
    last_vs = pp * vpp - 1
    done: dict[tuple[bool, int, int], int] = {}
    ticks = [[0] * len(stage_ops) for stage_ops in ops]
    pos = [0] * pp
    free = [0] * pp
    waiting: dict[tuple[bool, int, int], int] = {}
    work = list(range(pp - 1, -1, -1))
    while work:
        s = work.pop()
        stage_ops = ops[s]
        while pos[s] < len(stage_ops):
            op = stage_ops[pos[s]]
            is_f = op.kind == "F"
            vs = op.chunk * pp + s
            start = free[s]
            need = ((True, vs - 1, op.unit) if is_f and vs > 0 else
                    (False, vs + 1, op.unit) if not is_f and vs < last_vs else None)
            if need is not None:
                ready = done.get(need)
                if ready is None:
                    waiting[need] = s
                    break
                start = max(start, ready)
            ticks[s][pos[s]] = start
            free[s] = start + 1
            key = (is_f, vs, op.unit)
            done[key] = start + 1
            waiter = waiting.pop(key, None)
            if waiter is not None:
                work.append(waiter)
            pos[s] += 1
    if any(pos[s] < len(ops[s]) for s in range(pp)):
        raise ValueError("schedule_ticks: the op lists cannot complete (deadlock)")
    return ticks


def _shrink(pieces: Pieces, fraction: float) -> tuple[Pieces, Pieces]:
    """(the heavy rank's pieces after shipping ``fraction`` of each prefix, the shipped blocks
    as (query tokens, KV tokens)); KV is cut in whole tiles."""
    kept, shipped = [], []
    for q, p in pieces:
        d = min(p, round(fraction * p / TILE) * TILE)
        kept.append((q, p - d))
        if d > 0:
            shipped.append((q, d))
    return tuple(kept), tuple(shipped)


class _Pricer:
    """Per-layer pass times through the cost model, cached (fixed-length samples repeat the
    same slices in every micro-batch)."""

    def __init__(self, cost: CostModel, *, tp: int, recompute: str) -> None:
        self.cost, self.tp, self.recompute = cost, tp, recompute
        self._cache: dict[Pieces, tuple[float, float]] = {}

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
        k = 1 if backward else 0
        return (self.times(shipped)[k]
                - self.times(tuple((q, 0) for q, _ in shipped))[k])


def prefix_weight(ranks: RankPieces) -> int:
    """Query tokens times KV prefix, summed over pieces and CP ranks: the pairing key (for
    SlimPipe's one-document slices, its KV prefix)."""
    return sum(q * p for r in ranks for q, p in r)


def pair_move(heavy: RankPieces, light: RankPieces, *, heavy_s: float, light_s: float,
              heavy_layers: int, light_layers: int, pricer: _Pricer, backward: bool,
              model: ModelSpec, tp: int, comm_time) -> PairMove:  # noqa: ANN001 - bytes -> s
    """Balance one (heavy, light) pair of ops whose current durations are ``heavy_s`` and
    ``light_s`` (their layers, LM-head share and CP communication included);
    ``comm_time(bytes)`` prices one transfer. The returned changes are whole-op seconds."""
    k = 1 if backward else 0
    nh, nl = heavy_layers, light_layers
    # Only pieces with a KV prefix change. Attention adds over the pieces of a varlen launch
    # (both cost models sum tile work), so each rank's change is priced on those few pieces
    # alone and added to the op's current duration. With CP the op changes by its CP ranks'
    # least favourable change (the smallest saving, the largest addition): exact for cp = 1,
    # conservative otherwise.
    ranks = []
    for hr in heavy:
        prefixed = tuple(p for p in hr if p[1] > 0)
        ranks.append((prefixed, pricer.times(prefixed)[k] if prefixed else 0.0))

    def shrunk(prefixed: Pieces, fraction: float) -> tuple[float, Pieces]:
        """(time of the prefixed pieces after shipping, the shipped blocks)."""
        kept, shipped = _shrink(prefixed, fraction)
        return (pricer.times(kept)[k] if kept else 0.0), shipped

    def sides(fraction: float) -> tuple[float, float, list[Pieces]]:
        saved, extra = -float("inf"), 0.0
        blocks = []
        for prefixed, prefixed_s, in ranks:
            kept_s, shipped = shrunk(prefixed, fraction)
            saved = max(saved, kept_s - prefixed_s)
            extra = max(extra, pricer.block(shipped, backward))
            blocks.append(shipped)
        return heavy_s + nh * saved, light_s + nl * extra, blocks

    h0, l0 = heavy_s, light_s
    if h0 <= l0:
        return NO_MOVE
    q_bytes = model.q_dim / tp * BF16
    lse_bytes = model.num_heads / tp * FP32
    kv_bytes = kv_bytes_per_token_per_layer(model, tp)
    # The pair can at best meet in the middle, moving (h0 - l0) / 2; the query's round trip
    # alone is a lower bound on the exposed transfer, so pairs that cannot pass the transfer
    # share skip the search.
    queries = max(sum(q for q, p in r if p > 0) for r in heavy)
    floor = (comm_time(queries * (2 * q_bytes + lse_bytes)) + comm_time(queries * q_bytes)
             if backward else
             comm_time(queries * q_bytes) + comm_time(queries * (q_bytes + lse_bytes)))
    if queries == 0 or MAX_TRANSFER_SHARE * (h0 - l0) / 2 < floor * nh:
        return NO_MOVE
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
    # Transfers per layer: the busiest CP rank's blocks set the pace (ranks of a stage send in
    # parallel); the KV block overlaps the light rank's own per-layer pass.
    light_layer_s = l0 / nl
    exposed = held = 0.0
    for shipped in blocks:
        q = sum(t for t, _ in shipped)
        kv = sum(d for _, d in shipped) * kv_bytes
        if q == 0:
            continue
        if backward:
            send = comm_time(q * (2 * q_bytes + lse_bytes))  # Q, dO, log-sum-exp
            back = comm_time(q * q_bytes + kv)  # dQ and the block's dK, dV
        else:
            send = comm_time(q * q_bytes)
            back = comm_time(q * (q_bytes + lse_bytes))  # partial output + log-sum-exp
        kv_wait = max(0.0, comm_time(kv) - light_layer_s) if kv else 0.0
        exposed = max(exposed, send + back + kv_wait)
        held = max(held, kv)
    if max(h, l_) + nh * exposed >= h0:
        # Short slices: shipping costs more than it saves, so the pair runs as it is.
        return NO_MOVE
    if nh * exposed > MAX_TRANSFER_SHARE * (h0 - h):
        return NO_MOVE
    cp = len(heavy)
    moved = sum(prefixed_s - shrunk(prefixed, best)[0] for prefixed, prefixed_s in ranks)
    added = sum(pricer.block(shipped, backward) for shipped in blocks)
    return PairMove(heavy_delta_s=max(h, l_) - h0 + nh * exposed,
                    light_delta_s=l_ - l0 + nl * exposed, moved_s=nh * moved / cp,
                    added_s=nl * added / cp, transfer_s=nh * exposed, fraction=best,
                    block_bytes=held)


def _unit_pieces(group: Group, unit: Unit, slice_cache: dict) -> RankPieces:
    """Per-CP-rank (tokens, prefix) tuples of a unit; ``slice_cache`` is this module's own
    (the simulator's pricing keeps its shards in another form)."""
    per_rank: list[list[tuple[int, int]]] = [[] for _ in range(group.cp)]
    for sid in unit.slice_ids:
        key = (group.group_id, sid)
        shards = slice_cache.get(key)
        if shards is None:
            shards = shard_pieces([(seg.num_tokens, seg.start)
                                   for seg in group.slice(sid).segments],
                                  group.cp, group.cp_sharding)
            slice_cache[key] = shards
        for r in range(group.cp):
            per_rank[r].extend(shards[r])
    return tuple(tuple(r) for r in per_rank)


def _imbalance(sets: list[list[tuple[int, int]]], times: list[list[float]]) -> float:
    slowest = mean = 0.0
    for members in sets:
        ts = [times[vs][u] for vs, u in members]
        slowest += max(ts)
        mean += sum(ts) / len(ts)
    return slowest / mean if mean > 0 else 1.0


def redistribute_group(group: Group, ops: Sequence[Sequence[Op]], costs: GroupCosts, *,
                       model: ModelSpec, cost: CostModel, gpus_per_node: int,
                       ) -> tuple[GroupCosts, RedistributionStats]:
    """``costs`` with attention moved between concurrent ops of paired pipeline ranks."""
    pp, tp = group.pp, group.tp
    slice_cache: dict = {}
    ticks = schedule_ticks(ops, pp=pp, vpp=group.vpp)
    fwd_sets: dict[int, list[tuple[int, int]]] = defaultdict(list)
    bwd_sets: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for s, stage_ops in enumerate(ops):
        for op, tick in zip(stage_ops, ticks[s], strict=True):
            (fwd_sets if op.kind == "F" else bwd_sets)[tick].append((op.chunk * pp + s, op.unit))
    stage_nodes = [{r // gpus_per_node for r in group.stage_ranks(s)} for s in range(pp)]
    pricer = _Pricer(cost, tp=tp, recompute=group.recompute)
    pieces_of: dict[tuple[bool, int], RankPieces] = {}
    work_of: dict[tuple[bool, int], int] = {}
    moves: dict[tuple[bool, RankPieces, RankPieces, bool], PairMove] = {}
    fwd_s = [list(row) for row in costs.fwd_s]
    bwd_s = [list(row) for row in costs.bwd_s]
    pairs = 0
    moved = added = transfer = held = 0.0

    def pieces(backward: bool, u: int) -> RankPieces:
        got = pieces_of.get((backward, u))
        if got is None:
            units = group.backward_units if backward else group.forward_units
            got = pieces_of[(backward, u)] = _unit_pieces(group, units[u], slice_cache)
        return got

    def work(backward: bool, u: int) -> int:
        got = work_of.get((backward, u))
        if got is None:
            got = work_of[(backward, u)] = prefix_weight(pieces(backward, u))
        return got

    for tick in sorted(set(fwd_sets) | set(bwd_sets)):
        proposed = []  # (backward, heavy (vs, u), light (vs, u), move)
        for backward, sets in ((False, fwd_sets), (True, bwd_sets)):
            members = sets.get(tick, [])
            order = sorted(members, key=lambda m, b=backward: (-work(b, m[1]), m[0], m[1]))
            for a in range(len(order) // 2):
                (hvs, hu), (lvs, lu) = order[a], order[-1 - a]
                intra = len(stage_nodes[hvs % pp] | stage_nodes[lvs % pp]) == 1
                times = bwd_s if backward else fwd_s
                nh, nl = costs.layers[hvs], costs.layers[lvs]
                key = (backward, pieces(backward, hu), pieces(backward, lu), intra,
                       times[hvs][hu], times[lvs][lu], nh, nl)
                move = moves.get(key)
                if move is None:
                    move = moves[key] = pair_move(
                        key[1], key[2], heavy_s=key[4], light_s=key[5], heavy_layers=nh,
                        light_layers=nl, pricer=pricer, backward=backward, model=model, tp=tp,
                        comm_time=lambda b, intra=intra: cost.comm.p2p(b, intra_node=intra))
                if move is not NO_MOVE:
                    proposed.append((backward, (hvs, hu), (lvs, lu), move))
        if not proposed:
            continue
        # The ops of a tick run side by side, so the tick lasts as long as its slowest op
        # (forward or backward). Moves that do not shorten it only add transfers: keep the
        # tick's moves only if its slowest op gets faster (*reconstructed* rule: a runtime
        # would decide from a profile which pairs to exchange).
        new = {}
        for backward, (hvs, hu), (lvs, lu), move in proposed:
            times = bwd_s if backward else fwd_s
            new[(backward, hvs, hu)] = times[hvs][hu] + move.heavy_delta_s
            new[(backward, lvs, lu)] = times[lvs][lu] + move.light_delta_s
        slowest = max([fwd_s[vs][u] for vs, u in fwd_sets.get(tick, [])]
                      + [bwd_s[vs][u] for vs, u in bwd_sets.get(tick, [])])
        after = max([new.get((False, vs, u), fwd_s[vs][u]) for vs, u in fwd_sets.get(tick, [])]
                    + [new.get((True, vs, u), bwd_s[vs][u]) for vs, u in bwd_sets.get(tick, [])])
        if after >= slowest:
            continue
        for (backward, vs, u), t in new.items():
            (bwd_s if backward else fwd_s)[vs][u] = t
        for *_, move in proposed:
            pairs += 1
            moved += move.moved_s
            added += move.added_s
            transfer += move.transfer_s
            held = max(held, move.block_bytes)
    f_sets = [m for m in fwd_sets.values() if len(m) > 1]
    b_sets = [m for m in bwd_sets.values() if len(m) > 1]
    stats = RedistributionStats(
        pairs=pairs, block_bytes=held, moved_s=moved, added_s=added, transfer_s=transfer,
        fwd_imbalance_before=_imbalance(f_sets, costs.fwd_s),
        fwd_imbalance_after=_imbalance(f_sets, fwd_s),
        bwd_imbalance_before=_imbalance(b_sets, costs.bwd_s),
        bwd_imbalance_after=_imbalance(b_sets, bwd_s))
    return dataclasses.replace(costs, fwd_s=fwd_s, bwd_s=bwd_s), stats


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
