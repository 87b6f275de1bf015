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
from dataclasses import dataclass, field

from slimpack.cost.model import CostModel
from slimpack.plan import Group, Segment, Slice, Unit
from slimpack.sim.costs import group_costs

_GRID = sorted({int(round(2 ** (k / 4))) for k in range(16, 77)})  # 16 .. 512K tokens, 4 per octave
_REFERENCE_UNIT_TOKENS = 8192
_PREFIX_PROBE = (4096, 65536)  # (tokens, prefix)


@dataclass(frozen=True, kw_only=True)
class WorkEstimator:
    log_lengths: tuple[float, ...]
    log_fwd: tuple[float, ...]
    log_bwd: tuple[float, ...]
    fwd_per_prefix_pair: float
    bwd_per_prefix_pair: float
    _memo: dict = field(default_factory=dict, compare=False, repr=False)
    """(table id, tokens) -> seconds: planners ask for the same lengths many times."""

    @classmethod
    def from_cost(cls, cost: CostModel, *, tp: int, cp: int, cp_sharding: str = "per-document",
                  cp_kind: str = "ring") -> WorkEstimator:
        """Probe the simulator's pricing: seconds per layer on one GPU of the group."""
        probes: list[list[tuple[int, int]]] = []
        for length in _GRID:
            copies = max(1, _REFERENCE_UNIT_TOKENS // length)
            probes.append([(length, 0)] * copies)
        tokens, prefix = _PREFIX_PROBE
        probes.append([(tokens, 0)])
        probes.append([(tokens, prefix)])
        fwd, bwd = _price_probes(cost, probes, tp=tp, cp=cp, cp_sharding=cp_sharding,
                                 cp_kind=cp_kind)
        per_doc_f = [fwd[i] / len(probes[i]) for i in range(len(_GRID))]
        per_doc_b = [bwd[i] / len(probes[i]) for i in range(len(_GRID))]
        pairs = tokens * prefix
        return cls(
            log_lengths=tuple(math.log(n) for n in _GRID),
            log_fwd=tuple(math.log(max(t, 1e-15)) for t in per_doc_f),
            log_bwd=tuple(math.log(max(t, 1e-15)) for t in per_doc_b),
            fwd_per_prefix_pair=max(fwd[-1] - fwd[-2], 0.0) / pairs,
            bwd_per_prefix_pair=max(bwd[-1] - bwd[-2], 0.0) / pairs,
        )

    def _doc(self, table: tuple[float, ...], tokens: int) -> float:
        """Log-log interpolation (pure Python, memoised: called ~10^5 times per plan)."""
        key = (id(table), tokens)
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = self._interpolate(table, tokens)
        return cached

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

    def forward(self, tokens: int, prefix: int = 0) -> float:
        return self._doc(self.log_fwd, tokens) + self.fwd_per_prefix_pair * tokens * prefix

    def backward(self, tokens: int, prefix: int = 0) -> float:
        return self._doc(self.log_bwd, tokens) + self.bwd_per_prefix_pair * tokens * prefix

    def total(self, tokens: int, prefix: int = 0) -> float:
        return self.forward(tokens, prefix) + self.backward(tokens, prefix)


def _price_probes(cost: CostModel, probes: list[list[tuple[int, int]]], *, tp: int, cp: int,
                  cp_sharding: str, cp_kind: str) -> tuple[list[float], list[float]]:
    """Per-layer forward and backward seconds of one unit per probe (a 2-stage probe group,
    whose first stage carries no LM head)."""
    slices = []
    for i, pieces in enumerate(probes):
        segs = tuple(Segment(seq_id=j, start=p, end=p + n) for j, (n, p) in enumerate(pieces))
        slices.append(Slice(slice_id=i, segments=segs))
    units = tuple(Unit(slice_ids=(i,)) for i in range(len(probes)))
    group = Group(group_id=0, ranks=tuple(range(2 * tp * cp)), tp=tp, cp=cp, pp=2,
                  slices=tuple(slices), forward_units=units, backward_units=units,
                  cp_sharding=cp_sharding, cp_kind=cp_kind)
    costs = group_costs(group, model=cost.model, cost=cost,
                        gpus_per_node=cost.hardware.gpus_per_node)
    layers = costs.layers[0]
    return ([t / layers for t in costs.fwd_s[0]], [t / layers for t in costs.bwd_s[0]])
