"""Per-unit durations of one group, computed once before the timing walk.

Every forward unit and every backward unit gets its own price from the cost model (what
makes variable-length plans simulable): its pieces per CP rank, priced per layer, the
slowest CP rank setting the pace, times the layers of each virtual stage, plus the LM head
where it lives. Communication that travels between stages (activations, gradients) is priced
here too but scheduled on the comm lanes by the engine.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from slimpack.cost.cp_sharding import shard_buffers, shard_piece_arrays
from slimpack.cost.kernels import ATTN_TILE
from slimpack.cost.memory import kv_bytes_per_token_per_layer
from slimpack.cost.model import CostModel, PassTimes, rank_layer_times, training_of
from slimpack.plan import Group, PlanError, Unit
from slimpack.specs.model import ModelSpec

BF16 = 2
_START_END = operator.attrgetter("start", "end")


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupCosts:
    """Seconds per op of one group; lists indexed [virtual stage][unit] or [stage][unit]."""

    layers: list[int]
    """Transformer layers of each virtual stage (``chunk*pp + stage``)."""
    fwd_s: list[list[float]]
    bwd_s: list[list[float]]
    fwd_ideal_s: list[list[float]]
    """Mean over CP ranks and without CP communication: the perfectly balanced compute."""
    bwd_ideal_s: list[list[float]]
    fwd_send_s: list[list[float]]
    """p2p of a forward unit's output from a stage to the next virtual stage's stage."""
    bwd_send_s: list[list[float]]
    fwd_unit_tokens: list[int]
    bwd_unit_tokens: list[int]
    blocking_sends: bool = False
    """A stage's compute lane waits for each of its sends to arrive (``TrainingSpec.p2p_blocking``)."""


HOST_COPY_EFFICIENCY = 0.8
"""Share of the host link's datasheet bandwidth a pinned-memory copy reaches
(*reconstructed*: no cited measurement here)."""


def with_host_copies(costs: GroupCosts, *, fwd_offload: list[float], bwd_fetch: list[float],
                     host_link_gbps: float) -> GroupCosts:
    """Activation offload on a copy stream beside compute: a forward op lasts at least as long
    as copying what it offloads to host, a backward op as long as bringing it back (the copy
    overlaps the op's own compute; *reconstructed* policy, one unit's copy in flight)."""
    if not any(fwd_offload) and not any(bwd_fetch):
        return costs
    bandwidth = host_link_gbps * 1e9 * HOST_COPY_EFFICIENCY
    fwd = [[max(t, fwd_offload[u] * n / bandwidth) for u, t in enumerate(row)]
           for row, n in zip(costs.fwd_s, costs.layers, strict=True)]
    bwd = [[max(t, bwd_fetch[u] * n / bandwidth) for u, t in enumerate(row)]
           for row, n in zip(costs.bwd_s, costs.layers, strict=True)]
    return dataclasses.replace(costs, fwd_s=fwd, bwd_s=bwd)


def layers_per_virtual_stage(num_layers: int, pp: int, vpp: int) -> list[int]:
    """Even split; when it does not divide, the earliest virtual stages take one more."""
    stages = pp * vpp
    if num_layers < stages:
        raise ValueError(f"pp*vpp = {stages} exceeds num_layers = {num_layers}")
    base, rem = divmod(num_layers, stages)
    return [base + (1 if vs < rem else 0) for vs in range(stages)]


def group_layers(group: Group, num_layers: int) -> list[int]:
    """Decoder layers of each of ``group``'s virtual stages: its ``virtual_stage_layers``
    (PlanError unless they add up to the model's ``num_layers``), else the even split."""
    counts = group.virtual_stage_layers
    if counts is None:
        return layers_per_virtual_stage(num_layers, group.pp, group.vpp)
    if sum(counts) != num_layers:
        raise PlanError(f"Group {group.group_id}: virtual_stage_layers add up to {sum(counts)} "
                        f"layers, the model has {num_layers}")
    return list(counts)


def head_virtual_stages(group: Group) -> list[int]:
    """Virtual stages that run (a share of) the LM head and loss."""
    return head_stages(group.pp, group.vpp, vocab_parallel_pp=group.vocab_parallel_pp)


def head_stages(pp: int, vpp: int, *, vocab_parallel_pp: bool) -> list[int]:
    """:func:`head_virtual_stages` of a group of that shape."""
    if vocab_parallel_pp:
        # SlimPipe spreads the output layer over all pipeline ranks; each rank's share is
        # charged to its last model chunk (*reconstructed* placement, the total is exact).
        return [(vpp - 1) * pp + s for s in range(pp)]
    return [pp * vpp - 1]


def group_costs(group: Group, *, model: ModelSpec, cost: CostModel, gpus_per_node: int,
                slice_cache: dict | None = None, price_cache: dict | None = None,
                shards: SliceShards | None = None) -> GroupCosts:
    """Per-unit, per-virtual-stage seconds of one group (:func:`uniform_group_costs`); with
    ``recompute_layers``, each virtual stage's first ``k = min(recompute_layers, layers)``
    layers priced with full recompute and the others without: a unit's seconds on a stage of
    ``n`` layers are ``(n - k)/n`` of its price without recompute plus ``k/n`` of its price
    with (the LM head, in both, stays whole)."""
    if group.recompute_layers is None:
        return uniform_group_costs(group, model=model, cost=cost, gpus_per_node=gpus_per_node,
                                   slice_cache=slice_cache, price_cache=price_cache,
                                   shards=shards)
    priced = {mode: uniform_group_costs(
                  dataclasses.replace(group, recompute=mode, recompute_layers=None),
                  model=model, cost=cost, gpus_per_node=gpus_per_node, slice_cache=slice_cache,
                  price_cache=price_cache, shards=shards)
              for mode in ("none", "full")}
    kept, recomputed = priced["none"], priced["full"]
    recomputed_share = [min(group.recompute_layers, n) / n for n in kept.layers]

    def blend(name: str) -> list[list[float]]:
        return [[a * (1.0 - f) + b * f for a, b in zip(row_kept, row_full, strict=True)]
                for row_kept, row_full, f in zip(getattr(kept, name), getattr(recomputed, name),
                                                 recomputed_share, strict=True)]

    return dataclasses.replace(kept, **{name: blend(name) for name in (
        "fwd_s", "bwd_s", "fwd_ideal_s", "bwd_ideal_s")})


def uniform_group_costs(group: Group, *, model: ModelSpec, cost: CostModel, gpus_per_node: int,
                        slice_cache: dict | None = None, price_cache: dict | None = None,
                        shards: SliceShards | None = None) -> GroupCosts:
    """Per-unit, per-virtual-stage seconds of one group whose layers share one recompute mode.

    ``price_cache`` (kept by the caller for one cost model) reuses a unit's per-layer price
    between simulations: it is a pure function of the unit's slices (their documents' token
    counts and KV prefixes), the group's tp, cp, sharding, CP kind, recompute mode and
    whether the CP ring stays inside a node. A configuration search simulates the same
    fixed-length samples under dozens of layouts that differ only in dp, pp or vpp.
    ``shards``: the group's slices already CP-sharded (:class:`SliceShards`), when the caller
    keys or pieces them too.
    """
    pp, tp, cp = group.pp, group.tp, group.cp
    layers = group_layers(group, model.num_layers)
    stage_nodes = [{r // gpus_per_node for r in group.stage_ranks(s)} for s in range(pp)]
    cp_intra = cp_ring_intra_node(group, gpus_per_node)
    pieces_of = slice_cache if slice_cache is not None else {}

    def rank_pieces(unit: Unit) -> list[np.ndarray]:
        per_rank: list[list[np.ndarray]] = [[] for _ in range(cp)]
        for sid in unit.slice_ids:
            key = (group.group_id, sid)
            shards = pieces_of.get(key)
            if shards is None:
                shards = shard_piece_arrays(
                    [(seg.num_tokens, seg.start) for seg in group.slice(sid).segments],
                    cp, group.cp_sharding)
                pieces_of[key] = shards
            for r in range(cp):
                per_rank[r].append(shards[r])
        return [np.concatenate(r) if len(r) > 1 else r[0] for r in per_rank]

    setting = (tp, cp, group.cp_sharding, group.cp_kind, group.recompute, cp_intra)

    def price(unit: Unit) -> tuple[float, float, float, float, int]:
        return unit_layer_seconds(rank_pieces(unit), model=model, cost=cost, tp=tp, cp=cp,
                                  cp_kind=group.cp_kind, recompute=group.recompute,
                                  cp_intra=cp_intra)

    same = group.backward_units == group.forward_units
    units = list(group.forward_units) + ([] if same else list(group.backward_units))
    priced: list[tuple[float, float, float, float, int] | None] = [None] * len(units)
    keys: list = []
    if price_cache is not None:
        # A slice's key is its segments' (tokens, start) pairs as bytes: bytes cache their
        # hash, so a unit's key hashes in O(its slices), not O(its documents).
        index, rows, first = _slice_rows(group, [sid for u in units for sid in u.slice_ids])
        bounds = np.append(first, len(rows)) * rows.itemsize * 2
        raw = rows.tobytes()
        slice_key = [raw[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(),
                                               strict=True)]
        keys = [(setting, tuple(slice_key[index[sid]] for sid in u.slice_ids)) for u in units]
        priced = [price_cache.get(k) for k in keys]
    todo = [i for i, p in enumerate(priced) if p is None]
    if todo:
        # The group-wide shards serve when every unit is priced here; a few cache misses
        # shard their own slices only.
        whole = shards if len(todo) == len(units) else None
        fresh = unit_prices(group, [units[i] for i in todo], model=model, cost=cost,
                            cp_intra=cp_intra, shards=whole)
        if fresh is None:  # a cost model that prices pieces only
            fresh = [price(units[i]) for i in todo]
        for i, p in zip(todo, fresh, strict=True):
            priced[i] = p
            if keys:
                price_cache[keys[i]] = p
    fwd_priced = priced[:len(group.forward_units)]
    bwd_priced = fwd_priced if same else priced[len(group.forward_units):]
    fwd_tokens = [f[4] for f in fwd_priced]
    bwd_tokens = [b[4] for b in bwd_priced]

    head_vs = set(head_virtual_stages(group))
    shards = pp if group.vocab_parallel_pp else 1
    head_of: dict[int, PassTimes] = {}

    def head(tokens: list[int], backward: bool) -> np.ndarray:
        out = []
        for t in tokens:  # units repeat token counts: one cost-model call per count
            h = head_of.get(t)
            if h is None:
                h = head_of[t] = cost.head_times(-(-t // cp), tp=tp, vocab_shards=shards)
            out.append(h.backward_s if backward else h.forward_s)
        return np.array(out, dtype=np.float64)

    fwd_head = head(fwd_tokens, False) if head_vs else 0.0
    bwd_head = head(bwd_tokens, True) if head_vs else 0.0
    columns = [np.array([p[k] for p in rows], dtype=np.float64).reshape(-1)
               for rows, k in ((fwd_priced, 0), (bwd_priced, 1), (fwd_priced, 2),
                               (bwd_priced, 3))]
    fwd_s, bwd_s, fwd_ideal, bwd_ideal = [], [], [], []
    for vs, n in enumerate(layers):
        with_head = vs in head_vs
        # Elementwise the per-unit rule: seconds per layer * layers + the head (or + 0.0).
        for out, column, extra in ((fwd_s, columns[0], fwd_head), (bwd_s, columns[1], bwd_head),
                                   (fwd_ideal, columns[2], fwd_head),
                                   (bwd_ideal, columns[3], bwd_head)):
            out.append((column * n + (extra if with_head else 0.0)).tolist())

    training = training_of(cost)
    # Megatron's scatter/gather split without sequence parallelism: the receiver all-gathers
    # the 1/tp shares over its TP group on the compute stream (priced with blocking p2p).
    gather = training.p2p_blocking and tp > 1 and not training.sequence_parallel

    def sends(tokens: list[int], step: int) -> list[list[float]]:
        counts, where = np.unique(np.array(tokens, dtype=np.int64), return_inverse=True)
        by_link = {}
        for intra in (True, False):
            # Sequence parallelism (or the scatter/gather split): each TP rank sends its 1/tp
            # share of the hidden states.
            by_link[intra] = np.array(
                [cost.comm.p2p(t / (tp * cp) * model.hidden * BF16, intra_node=intra)
                 + (cost.comm.all_gather(t / cp * model.hidden * BF16, tp, intra_node=True)
                    if gather else 0.0)
                 for t in counts.tolist()], dtype=np.float64)[where.reshape(-1)]
        out = []
        for s in range(pp):
            peer = (s + step) % pp
            intra = len(stage_nodes[s] | stage_nodes[peer]) == 1
            out.append(by_link[intra].tolist())
        return out

    return GroupCosts(layers=layers, fwd_s=fwd_s, bwd_s=bwd_s, fwd_ideal_s=fwd_ideal,
                      bwd_ideal_s=bwd_ideal, fwd_send_s=sends(fwd_tokens, 1),
                      bwd_send_s=sends(bwd_tokens, -1), fwd_unit_tokens=fwd_tokens,
                      bwd_unit_tokens=bwd_tokens, blocking_sends=training.p2p_blocking)


def cp_ring_intra_node(group: Group, gpus_per_node: int) -> bool:
    """Whether every stage's CP ring (its tp*cp ranks) stays inside one node: the link the
    ring's K/V steps are priced on."""
    return all(len({r // gpus_per_node for r in group.stage_ranks(s)}) == 1
               for s in range(group.pp))


def ring_step_seconds(cost: CostModel, model: ModelSpec, *, tp: int, rank_tokens: int,
                      cp_intra: bool) -> float:
    """One step of ring attention for one layer: a rank's K,V chunk of ``rank_tokens`` tokens
    to its ring neighbour. A layer's forward takes at least ``cp - 1`` steps, its backward
    ``2 (cp - 1)`` (dK, dV travel too)."""
    return cost.comm.p2p(rank_tokens * kv_bytes_per_token_per_layer(model, tp),
                         intra_node=cp_intra)


def unit_prices(group: Group, units: Sequence[Unit], *, model: ModelSpec, cost: CostModel,
                cp_intra: bool = True, shards: SliceShards | None = None,
                ) -> list[tuple[float, float, float, float, int]] | None:
    """:func:`unit_layer_seconds` of every unit in ``units`` in one numpy pass, element for
    element equal to pricing them one by one (integer sums exact, the same float operations
    in the same order), or ``None`` where that is not available: a cost model without
    ``layer_times_of_work`` (or one that declines it; for Ulysses CP, a model with
    ``ulysses_layer_times`` but no ``ulysses_layer_times_of_work``) is priced unit by unit.

    Every slice is sharded once (:func:`~slimpack.cost.cp_sharding.shard_buffers`); a unit's
    pieces on a CP rank are its slices' pieces on that rank, so its tokens, key tiles and
    query tiles per rank are sums of per-(slice, rank) sums.
    """
    tp, cp = group.tp, group.cp
    ulysses = cp > 1 and group.cp_kind == "ulysses"
    batched = getattr(cost, "layer_times_of_work", None)
    if ulysses and getattr(cost, "ulysses_layer_times", None) is not None:
        batched = getattr(cost, "ulysses_layer_times_of_work", None)
    if batched is None or not units:
        return None
    def work(tokens: np.ndarray, prefix: np.ndarray) -> list[np.ndarray]:
        nq = -(-tokens // ATTN_TILE)
        return [tokens, nq * -(-prefix // ATTN_TILE) + nq * (nq + 1) // 2, nq]

    per_unit = unit_rank_sums(group, units, work, shards)  # (3, unit, rank)
    rank_tokens, rank_tiles, rank_queries = (x.T for x in per_unit)  # each (rank, unit)
    if ulysses:
        return _ulysses_prices(per_unit.sum(axis=2), batched, model=model, cost=cost, tp=tp,
                               cp=cp, recompute=group.recompute, cp_intra=cp_intra)
    times = batched(rank_tokens, rank_tiles, rank_queries, tp=tp, recompute=group.recompute)
    if times is None:
        return None
    fwd_rank, bwd_rank = times
    fwd, bwd = fwd_rank.max(axis=0), bwd_rank.max(axis=0)
    # The balanced price: the ranks summed in order, as Python's sum() does, then / cp.
    fwd_sum, bwd_sum = fwd_rank[0].copy(), bwd_rank[0].copy()
    for r in range(1, cp):
        fwd_sum += fwd_rank[r]
        bwd_sum += bwd_rank[r]
    if cp > 1:
        # Ring attention's K,V steps (see unit_layer_seconds), one price per token count.
        largest, where = np.unique(rank_tokens.max(axis=0), return_inverse=True)
        step = np.array([ring_step_seconds(cost, model, tp=tp, rank_tokens=n,
                                           cp_intra=cp_intra) for n in largest.tolist()],
                        dtype=np.float64)[where.reshape(-1)]
        fwd = np.maximum(fwd, (cp - 1) * step)
        bwd = np.maximum(bwd, 2 * (cp - 1) * step)
    return list(zip(fwd.tolist(), bwd.tolist(), (fwd_sum / cp).tolist(),
                    (bwd_sum / cp).tolist(), rank_tokens.sum(axis=0).tolist(), strict=True))


class SliceShards:
    """Every slice of one group CP-sharded once
    (:func:`~slimpack.cost.cp_sharding.shard_buffers`, equal to sharding each alone), on
    first use: one simulation prices the group's units (:func:`unit_prices`) and, with
    attention redistribution, keys and pieces its ops (``slimpack.sim.redistribution``)
    from the same shards instead of sharding each slice three times."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self._arrays: tuple[dict[int, int], np.ndarray, np.ndarray, np.ndarray] | None = None
        self._bounds: np.ndarray | None = None

    @property
    def arrays(self) -> tuple[dict[int, int], np.ndarray, np.ndarray, np.ndarray]:
        """(slice id -> its buffer, then :func:`shard_buffers`' ``(buffer, rank, chunks)``)."""
        if self._arrays is None:
            group = self.group
            index, rows, first = _slice_rows(group, [sl.slice_id for sl in group.slices])
            self._arrays = (index, *shard_buffers(rows, first, group.cp, group.cp_sharding))
        return self._arrays

    def rank_pieces(self, slice_id: int) -> list[list[tuple[int, int]]]:
        """Per CP rank, the slice's ``(tokens, kv_prefix)`` pieces (``shard_pieces`` of its
        segments)."""
        index, buffer, rank, chunks = self.arrays
        cp = self.group.cp
        if self._bounds is None:
            keys = np.arange(len(index) * cp + 1, dtype=np.int64)
            self._bounds = np.searchsorted(buffer * cp + rank, keys)
        at = index[slice_id] * cp
        bounds = self._bounds[at:at + cp + 1].tolist()
        return [[(t, p) for t, p in chunks[a:b].tolist()]
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def unit_rank_sums(group: Group, units: Sequence[Unit],
                   columns: Callable[[np.ndarray, np.ndarray], list[np.ndarray]],
                   shards: SliceShards | None = None) -> np.ndarray:
    """Integer sums per (unit, CP rank) over the unit's CP-sharded pieces, shape
    ``(len(columns(...)), len(units), cp)``; ``columns(tokens, kv_prefix)`` maps the pieces'
    two int64 columns to the per-piece values to sum. Exact: every slice is sharded once
    (:func:`~slimpack.cost.cp_sharding.shard_buffers`, equal to sharding it alone; ``shards``
    where the caller already sharded the group's slices), and a unit's pieces on a rank are
    its slices' pieces on that rank. Every unit holds a slice."""
    cp = group.cp
    if shards is not None:
        index, buffer, rank, chunks = shards.arrays
        num_slices = len(index)
    else:
        index, rows, first = _slice_rows(group, [sid for u in units for sid in u.slice_ids])
        buffer, rank, chunks = shard_buffers(rows, first, cp, group.cp_sharding)
        num_slices = len(first)
    values = columns(chunks[:, 0], chunks[:, 1])
    # Per (slice, rank) sums; shard_buffers sorts pieces by (slice, rank).
    key = buffer * cp + rank
    per_slice = np.zeros((len(values), num_slices * cp), dtype=np.int64)
    if len(key):
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        for row, column in enumerate(values):
            per_slice[row, key[starts]] = np.add.reduceat(column, starts)
    per_slice = per_slice.reshape(len(values), num_slices, cp)
    # Per (unit, rank): the sums of the unit's slices.
    members = np.array([index[sid] for unit in units for sid in unit.slice_ids], dtype=np.int64)
    unit_start = np.cumsum([0] + [len(unit.slice_ids) for unit in units[:-1]])
    return np.add.reduceat(per_slice[:, members, :], unit_start, axis=1)


def _slice_rows(group: Group, slice_ids: Iterable[int]
                ) -> tuple[dict[int, int], np.ndarray, np.ndarray]:
    """The distinct slices of ``slice_ids``: slice id -> its position, the ``(tokens, start)``
    rows of their segments one slice after another, and the row where each slice starts."""
    index: dict[int, int] = {}
    slices = []
    for sid in slice_ids:
        if sid not in index:
            index[sid] = len(slices)
            slices.append(group.slice(sid).segments)
    counts = np.fromiter(map(len, slices), dtype=np.int64, count=len(slices))
    pairs = map(_START_END, itertools.chain.from_iterable(slices))
    bounds = np.fromiter(itertools.chain.from_iterable(pairs), dtype=np.int64,
                         count=2 * int(counts.sum())).reshape(-1, 2)
    rows = np.stack([bounds[:, 1] - bounds[:, 0], bounds[:, 0]], axis=1)
    return index, rows, np.cumsum(counts) - counts


def _ulysses_prices(sums: np.ndarray, batched, *, model: ModelSpec, cost: CostModel, tp: int,
                    cp: int, recompute: str, cp_intra: bool
                    ) -> list[tuple[float, float, float, float, int]] | None:
    """:func:`unit_layer_seconds`'s Ulysses rule from each unit's (tokens, tiles, queries)
    summed over all its CP chunks: ``ulysses_layer_times`` where the cost model has it, else
    the heads split as a tp*cp TP group; plus the all-to-alls."""
    tokens, tiles, queries = sums
    if getattr(cost, "ulysses_layer_times", None) is not None:
        times = batched(tokens, tiles, queries, tp=tp, sp=cp, recompute=recompute)
    else:
        times = batched(tokens, tiles, queries, tp=tp * cp, recompute=recompute)
    if times is None:
        return None
    fwd, bwd = times
    counts, where = np.unique(tokens, return_inverse=True)
    comm = np.array([_ulysses_comm(model, cost, n / cp, tp, cp, cp_intra)
                     for n in counts.tolist()], dtype=np.float64)[where.reshape(-1)]
    return list(zip((fwd + comm).tolist(), (bwd + comm).tolist(), fwd.tolist(), bwd.tolist(),
                    tokens.tolist(), strict=True))


def unit_layer_seconds(per_rank: list[list[tuple[int, int]]], *, model: ModelSpec,
                       cost: CostModel, tp: int, cp: int, cp_kind: str = "ring",
                       recompute: str = "none",
                       cp_intra: bool = True) -> tuple[float, float, float, float, int]:
    """One unit's price per layer from its pieces on each CP rank: (fwd, bwd) seconds of the
    slowest rank with CP communication, the balanced (fwd, bwd) seconds, and its tokens.

    The simulator's own rule, public so that planners price candidate units exactly as the
    simulator will (``per_rank`` from :func:`slimpack.cost.cp_sharding.shard_pieces`, one
    call per slice, concatenated per rank).
    """
    rank_tokens = [_tokens(r) for r in per_rank]
    tokens = sum(rank_tokens)
    if cp > 1 and cp_kind == "ulysses":
        # Heads are split over the CP group after the all-to-all: every rank does 1/cp of
        # all the unit's work, so it is balanced by construction.
        if all(isinstance(r, np.ndarray) for r in per_rank):
            all_pieces = np.concatenate(per_rank)
        else:
            all_pieces = [p for r in per_rank for p in r]
        ulysses = getattr(cost, "ulysses_layer_times", None)
        if ulysses is not None:
            t = ulysses(all_pieces, tp=tp, sp=cp, recompute=recompute)
        else:  # a cost model without Ulysses pricing: the heads split as a tp*cp TP group
            t = cost.layer_times(all_pieces, tp=tp * cp, recompute=recompute)
        comm = _ulysses_comm(model, cost, tokens / cp, tp, cp, cp_intra)
        return t.forward_s + comm, t.backward_s + comm, t.forward_s, t.backward_s, tokens
    times = rank_layer_times(cost, per_rank, tp=tp, recompute=recompute)
    fwd = max(t.forward_s for t in times)
    bwd = max(t.backward_s for t in times)
    if cp > 1:
        # Ring attention ships each rank's K,V chunk round the ring (cp-1 steps) and, in
        # backward, dK/dV too; it overlaps with attention, so a layer takes the longer.
        step = ring_step_seconds(cost, model, tp=tp, rank_tokens=max(rank_tokens),
                                 cp_intra=cp_intra)
        fwd = max(fwd, (cp - 1) * step)
        bwd = max(bwd, 2 * (cp - 1) * step)
    return (fwd, bwd, sum(t.forward_s for t in times) / cp,
            sum(t.backward_s for t in times) / cp, tokens)


def _tokens(pieces: Sequence[tuple[int, int]] | np.ndarray) -> int:
    if isinstance(pieces, np.ndarray):
        return int(pieces[:, 0].sum()) if len(pieces) else 0
    return sum(t for t, _ in pieces)


def _ulysses_comm(model: ModelSpec, cost: CostModel, rank_tokens: float, tp: int, cp: int,
                  intra: bool) -> float:
    """Four all-to-alls per layer and pass (q, k, v in; attention output back)."""
    q_bytes = rank_tokens * model.q_dim / tp * BF16
    kv_bytes = rank_tokens * kv_bytes_per_token_per_layer(model, tp) / 2  # K or V alone
    a2a = cost.comm.all_to_all
    return 2 * a2a(q_bytes, cp, intra_node=intra) + 2 * a2a(kv_bytes, cp, intra_node=intra)
