"""Fast work estimates the planner balances on, priced exactly as the simulator prices units.

The planner makes hundreds of thousands of cost queries, so it cannot simulate each
candidate MicroPack. Instead it prices a few *probe* units through the simulator's own unit
pricing (:func:`slimpack.sim.costs.group_costs`: the cost model, the CP sharding, ring or
Ulysses communication) once per plan, and builds two small models from them:

* a table of the per-document cost of a document of length ``l`` packed among many of its
  kind (this is where short documents' poor attention-kernel efficiency and per-document CP
  chunking show up), interpolated in log-log space;
* a per-pair cost for the KV prefix of long-sequence slices (``l * p`` extra causal pairs).

Forward and backward are kept apart, since their ratios differ (about 2x for linear work and
2.5x for attention): that gap is what asymmetric MicroPacks balance.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from slimpack.cost.cp_sharding import shard_pieces
from slimpack.cost.model import CostModel
from slimpack.plan import Group, Segment, Slice, Unit
from slimpack.sim.costs import group_costs, unit_layer_seconds, unit_prices

_GRID = sorted({int(round(2 ** (k / 4))) for k in range(16, 77)})  # 16 .. 512K tokens, 4 per octave
_REFERENCE_UNIT_TOKENS = 8192
_PREFIX_PROBE = (4096, 65536)  # (tokens, prefix)
_FIXED_PROBE, _FIXED_COPIES = 1024, 4  # the fixed part: 4 vs 8 documents of 1K tokens


@dataclass(frozen=True, kw_only=True)
class WorkEstimator:
    log_lengths: tuple[float, ...]
    log_fwd: tuple[float, ...]
    log_bwd: tuple[float, ...]
    fwd_per_prefix_pair: float
    bwd_per_prefix_pair: float
    _memo: dict = field(default_factory=dict, compare=False, repr=False)
    """(tokens, prefix) -> (fwd, bwd) seconds of a segment with a KV prefix."""
    _fwd_memo: dict = field(default_factory=dict, compare=False, repr=False)
    """tokens -> forward seconds of a document: planners ask for the same lengths many
    times (one int-keyed dict per table: no key tuple to build per query)."""
    _bwd_memo: dict = field(default_factory=dict, compare=False, repr=False)

    unit_fwd: float = 0.0
    """Seconds a MicroPack costs whatever it holds (kernel launches, the GEMMs' fixed part,
    collective latency): what ``unit_forward`` adds to its pieces' marginal costs."""
    unit_bwd: float = 0.0
    segment_price: Callable[[int, int], tuple[float, float]] | None = field(
        default=None, compare=False, repr=False)
    """Exact (fwd, bwd) marginal seconds of one segment with a KV prefix, on its real per-rank
    pieces (the per-pair fit misses tile waste: a slice's chunk per CP rank rounds up to
    128-token tiles against its whole prefix)."""
    segment_prices: Callable[[list[tuple[int, int]]], list[tuple[float, float]] | None] | None = \
        field(default=None, compare=False, repr=False)
    """``segment_price`` of many (tokens, prefix) segments in one batched pass, equal to it
    element for element; None where the cost model cannot batch (then priced one by one)."""

    @classmethod
    def from_cost(cls, cost: CostModel, *, tp: int, cp: int, cp_sharding: str = "per-document",
                  cp_kind: str = "ring", recompute: str = "none") -> WorkEstimator:
        """Probe the simulator's pricing: seconds per layer on one GPU of the group.

        A unit's price is modelled as affine: a fixed part per MicroPack plus a marginal
        part per piece (exact for the analytic model without CP: GEMM time over R rows at
        efficiency R/(R+h) is linear in R, launches and collective latency are constant).
        The fixed part comes from one and two copies of a small reference unit, the marginal
        cost of a length from a probe holding about 8K tokens of it, minus the fixed part.
        """
        probes: list[list[tuple[int, int]]] = []
        for length in _GRID:
            copies = max(1, _REFERENCE_UNIT_TOKENS // length)
            probes.append([(length, 0)] * copies)
        tokens, prefix = _PREFIX_PROBE
        probes.append([(tokens, 0)])
        probes.append([(tokens, prefix)])
        probes.append([(_FIXED_PROBE, 0)] * _FIXED_COPIES)
        probes.append([(_FIXED_PROBE, 0)] * (2 * _FIXED_COPIES))
        fwd, bwd = _price_probes(cost, probes, tp=tp, cp=cp, cp_sharding=cp_sharding,
                                 cp_kind=cp_kind, recompute=recompute)
        fixed_f = max(2 * fwd[-2] - fwd[-1], 0.0)
        fixed_b = max(2 * bwd[-2] - bwd[-1], 0.0)
        n = len(_GRID)
        per_doc_f = [(fwd[i] - fixed_f) / len(probes[i]) for i in range(n)]
        per_doc_b = [(bwd[i] - fixed_b) / len(probes[i]) for i in range(n)]
        pairs = tokens * prefix
        intra = tp * cp <= cost.hardware.gpus_per_node  # as in the probe group

        def segment_price(seg_tokens: int, seg_prefix: int) -> tuple[float, float]:
            f, b, *_ = unit_layer_seconds(shard_pieces([(seg_tokens, seg_prefix)], cp, cp_sharding),
                                          model=cost.model, cost=cost, tp=tp, cp=cp,
                                          cp_kind=cp_kind, recompute=recompute,
                                          cp_intra=intra)
            return max(f - fixed_f, 0.0), max(b - fixed_b, 0.0)

        def segment_prices(pieces: list[tuple[int, int]]) -> list[tuple[float, float]] | None:
            # unit_prices is unit_layer_seconds unit by unit, element for element, in one
            # numpy pass: a plan asks for thousands of distinct segments.
            priced = _price_units(cost, pieces, tp=tp, cp=cp, cp_sharding=cp_sharding,
                                  cp_kind=cp_kind, cp_intra=intra, recompute=recompute)
            if priced is None:
                return None
            return [(max(f - fixed_f, 0.0), max(b - fixed_b, 0.0)) for f, b, *_ in priced]

        return cls(
            log_lengths=tuple(math.log(x) for x in _GRID),
            log_fwd=tuple(math.log(max(t, 1e-15)) for t in per_doc_f),
            log_bwd=tuple(math.log(max(t, 1e-15)) for t in per_doc_b),
            fwd_per_prefix_pair=max(fwd[n + 1] - fwd[n], 0.0) / pairs,
            bwd_per_prefix_pair=max(bwd[n + 1] - bwd[n], 0.0) / pairs,
            unit_fwd=fixed_f, unit_bwd=fixed_b, segment_price=segment_price,
            segment_prices=segment_prices,
        )

    def _interpolate(self, table: tuple[float, ...], tokens: int) -> float:
        x = math.log(max(tokens, 1))
        xs = self.log_lengths
        i = bisect.bisect_right(xs, x)
        if i <= 0:
            return math.exp(table[0])
        # Past the grid, extrapolate along the last segment (attention-dominated: ~l^2).
        i = min(i, len(xs) - 1)
        t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return math.exp(table[i - 1] + t * (table[i] - table[i - 1]))

    def _segment(self, tokens: int, prefix: int) -> tuple[float, float]:
        key = (tokens, prefix)
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = self.segment_price(tokens, prefix)
        return cached

    def prefetch_segments(self, pieces) -> None:
        """Price, in one batched pass, the (tokens, prefix) segments with a KV prefix that are
        not memoised yet, so later ``forward``/``backward`` queries find them: pricing them one
        by one went through the cost model's per-piece path thousands of times per plan."""
        if self.segment_prices is None:
            return
        memo = self._memo
        todo = sorted({p for p in pieces if p[1] and p not in memo})
        if len(todo) < 2:
            return
        prices = self.segment_prices(todo)
        if prices is not None:
            memo.update(zip(todo, prices, strict=True))

    def forward(self, tokens: int, prefix: int = 0) -> float:
        # Log-log interpolation, memoised: called ~10^5 times per plan.
        if prefix and self.segment_price is not None:
            return self._segment(tokens, prefix)[0]
        doc = self._fwd_memo.get(tokens)
        if doc is None:
            doc = self._fwd_memo[tokens] = self._interpolate(self.log_fwd, tokens)
        return doc + self.fwd_per_prefix_pair * tokens * prefix

    def backward(self, tokens: int, prefix: int = 0) -> float:
        if prefix and self.segment_price is not None:
            return self._segment(tokens, prefix)[1]
        doc = self._bwd_memo.get(tokens)
        if doc is None:
            doc = self._bwd_memo[tokens] = self._interpolate(self.log_bwd, tokens)
        return doc + self.bwd_per_prefix_pair * tokens * prefix

    def documents_forward(self, lengths: dict[int, int]) -> dict[int, float]:
        """seq_id -> ``forward(length)`` of whole documents (no KV prefix), through the
        per-length memo without a method call each: a replica asks for ~10^4 per packing."""
        return self._documents(lengths, self._fwd_memo, self.log_fwd)

    def documents_backward(self, lengths: dict[int, int]) -> dict[int, float]:
        """seq_id -> ``backward(length)`` of whole documents (see :meth:`documents_forward`)."""
        return self._documents(lengths, self._bwd_memo, self.log_bwd)

    def _documents(self, lengths: dict[int, int], memo: dict[int, float],
                   table: tuple[float, ...]) -> dict[int, float]:
        # forward(n) is memo[n] + per_pair * n * 0, and x + 0.0 == x for the positive x here:
        # the memoised value is the same float.
        get = memo.get
        out = {}
        for seq_id, n in lengths.items():
            value = get(n)
            if value is None:
                value = memo[n] = self._interpolate(table, n)
            out[seq_id] = value
        return out

    def total(self, tokens: int, prefix: int = 0) -> float:
        return self.forward(tokens, prefix) + self.backward(tokens, prefix)

    def unit_forward(self, pieces) -> float:
        """Estimated forward seconds per layer of a MicroPack holding ``pieces``
        ((tokens, kv_prefix) of each segment)."""
        return self.unit_fwd + sum(self.forward(t, p) for t, p in pieces)

    def unit_backward(self, pieces) -> float:
        return self.unit_bwd + sum(self.backward(t, p) for t, p in pieces)


def _price_probes(cost: CostModel, probes: list[list[tuple[int, int]]], *, tp: int, cp: int,
                  cp_sharding: str, cp_kind: str, recompute: str = "none",
                  ) -> tuple[list[float], list[float]]:
    """Per-layer forward and backward seconds of one unit per probe (a 2-stage probe group,
    whose first stage carries no LM head)."""
    slices = []
    for i, pieces in enumerate(probes):
        segs = tuple(Segment(seq_id=j, start=p, end=p + n) for j, (n, p) in enumerate(pieces))
        slices.append(Slice(slice_id=i, segments=segs))
    units = tuple(Unit(slice_ids=(i,)) for i in range(len(probes)))
    group = Group(group_id=0, ranks=tuple(range(2 * tp * cp)), tp=tp, cp=cp, pp=2,
                  slices=tuple(slices), forward_units=units, backward_units=units,
                  cp_sharding=cp_sharding, cp_kind=cp_kind, recompute=recompute)
    costs = group_costs(group, model=cost.model, cost=cost,
                        gpus_per_node=cost.hardware.gpus_per_node)
    layers = costs.layers[0]
    return ([t / layers for t in costs.fwd_s[0]], [t / layers for t in costs.bwd_s[0]])


def _price_units(cost: CostModel, pieces: list[tuple[int, int]], *, tp: int, cp: int,
                 cp_sharding: str, cp_kind: str, cp_intra: bool, recompute: str = "none",
                 ) -> list[tuple[float, float, float, float, int]] | None:
    """``unit_layer_seconds`` of one unit per (tokens, prefix) piece, batched through the
    simulator's ``unit_prices`` (None where the cost model prices piece by piece)."""
    slices = tuple(Slice(slice_id=i, segments=(Segment(seq_id=0, start=p, end=p + n),))
                   for i, (n, p) in enumerate(pieces))
    units = tuple(Unit(slice_ids=(i,)) for i in range(len(pieces)))
    group = Group(group_id=0, ranks=tuple(range(2 * tp * cp)), tp=tp, cp=cp, pp=2,
                  slices=slices, forward_units=units, backward_units=units,
                  cp_sharding=cp_sharding, cp_kind=cp_kind, recompute=recompute)
    return unit_prices(group, units, model=cost.model, cost=cost, cp_intra=cp_intra)


def first_tile_reaching(work_at: Callable[[int], float], goal: float, lo: int, hi: int,
                        align: int) -> int:
    """The first tile index in ``[lo, hi]`` whose boundary ``index * align`` has cumulative
    work ``work_at(tokens)`` of at least ``goal`` (``hi`` when none in ``[lo, hi)`` does):
    where a cost-balanced cut goes. ``work_at`` must not decrease."""
    while lo < hi:
        mid = (lo + hi) // 2
        if work_at(mid * align) < goal:
            lo = mid + 1
        else:
            hi = mid
    return lo
