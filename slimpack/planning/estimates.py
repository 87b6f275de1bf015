"""Quick time estimates from the cost model, for planners' inner loops.

The simulator is the judge; these are the planners' own cheap views of the same cost model
(same ``layer_times``/``head_times``), so a planner never has a private notion of cost.
"""

from __future__ import annotations

from collections.abc import Sequence

from slimpack.cost.cp_sharding import shard_piece_arrays
from slimpack.cost.model import CostModel, PassTimes, rank_layer_times


def stage_layers(num_layers: int, pp: int) -> int:
    return max(num_layers // pp, 1)


def microbatch_stage_times(cost: CostModel, doc_lengths: Sequence[int], *, tp: int = 1,
                           cp: int = 1, pp: int = 1, sharding: str = "per-sequence",
                           recompute: str = "none") -> PassTimes:
    """Forward/backward seconds of one pipeline stage for one packed micro-batch: the slowest
    CP rank (ranks wait for each other in ring attention), no communication."""
    layers = stage_layers(cost.model.num_layers, pp)
    worst_f = worst_b = 0.0
    per_rank = shard_piece_arrays([(int(n), 0) for n in doc_lengths], cp, sharding)
    for t in rank_layer_times(cost, per_rank, tp=tp, recompute=recompute):
        worst_f = max(worst_f, t.forward_s * layers)
        worst_b = max(worst_b, t.backward_s * layers)
    return PassTimes(forward_s=worst_f, backward_s=worst_b)


def document_seconds(cost: CostModel, length: int, *, tp: int = 1) -> float:
    """Forward+backward seconds of one layer for one whole document on one device: the per-
    document workload that balancing heuristics add up (quadratic attention + linear rest)."""
    t = cost.layer_times([(int(length), 0)], tp=tp)
    return t.forward_s + t.backward_s


def pipeline_seconds(unit_seconds: Sequence[float], *, pp: int, vpp: int = 1) -> float:
    """1F1B-family makespan estimate of one pipeline: all units once, plus a fill/drain of
    (pp-1)/vpp times the largest unit (the bubble of docs/cost-model.md with uneven units)."""
    if not unit_seconds:
        return 0.0
    return sum(unit_seconds) + (pp - 1) / vpp * max(unit_seconds)


def imbalance_degree(unit_seconds: Sequence[float]) -> float:
    """WLB-LLM's imbalance degree (arXiv 2503.17924, Table 2): the slowest micro-batch's
    latency times the number of micro-batches over the total latency (1.0 = perfect)."""
    total = float(sum(unit_seconds))
    if not unit_seconds or total <= 0:
        return 1.0
    return max(unit_seconds) * len(unit_seconds) / total
