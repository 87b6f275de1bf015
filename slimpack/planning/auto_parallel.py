"""Search space of parallel configurations, filtered by the memory model.

The SlimPipe paper (arXiv 2504.14519, section 6) compares every method at its best
(tp, cp, pp, vpp, dp, recompute); this module lists the candidates that fit, and
:mod:`slimpack.compare` picks the fastest by planning and simulating them (pruned by a lower
bound; the estimate here only orders the search).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from slimpack.cost.model import CostModel
from slimpack.planning.estimates import microbatch_stage_times, pipeline_seconds
from slimpack.planning.memory_fit import choose_recompute
from slimpack.planning.packing import concat_and_chunk
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec


@dataclass(frozen=True, kw_only=True)
class Candidate:
    parallel: ParallelSpec
    recompute: str
    """Cheapest recompute mode that fits a ``context``-token micro-batch."""


def _powers_of_two(limit: int) -> list[int]:
    out, k = [], 1
    while k <= limit:
        out.append(k)
        k *= 2
    return out


def auto_parallel_candidates(model: ModelSpec, hardware: HardwareSpec, gpus: int, context: int,
                             *, schedule: str = "1f1b", max_tp: int | None = None,
                             max_cp: int = 32, max_pp: int = 16, vpp_options: Sequence[int] = (1, 2),
                             slices_per_stage: int = 4) -> list[Candidate]:
    """Every (tp, cp, pp, vpp, dp) over ``gpus`` GPUs that shards ``model`` and fits a
    ``context``-token micro-batch with some recompute mode; for an MoE model also every
    expert-parallel degree ``ep`` (a power of two dividing ``dp * cp`` and the experts) at
    tp = 1, where the simulator prices it (:mod:`slimpack.sim.expert_dispatch`).

    ``schedule``: ``1f1b`` (vpp > 1 means interleaved), or ``slimpipe`` (memory priced for
    ``slices_per_stage * pp`` slices per sequence, vocabulary spread over pipeline ranks).
    tp stays inside a node (Megatron-LM practice).
    """
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if context < 1:
        raise ValueError(f"context must be >= 1 token, got {context}")
    max_tp = min(max_tp or hardware.gpus_per_node, hardware.gpus_per_node)
    out: list[Candidate] = []
    for tp in _powers_of_two(min(max_tp, gpus)):
        for cp in _powers_of_two(min(max_cp, gpus // tp)):
            for pp in range(1, min(max_pp, gpus // (tp * cp)) + 1):
                if (gpus // (tp * cp)) % pp or gpus % (tp * cp * pp):
                    continue
                for vpp in vpp_options:
                    if vpp > 1 and pp == 1:
                        continue
                    try:
                        par = ParallelSpec.for_world(gpus, tp=tp, cp=cp, pp=pp, vpp=vpp,
                                                     gpus_per_node=hardware.gpus_per_node)
                        par.validate_for_model(model)
                    except ValueError:
                        continue
                    kind = schedule if schedule == "slimpipe" else (
                        "interleaved" if vpp > 1 else "1f1b")
                    slices = slices_per_stage * pp if kind == "slimpipe" else 1
                    for ep in _expert_degrees(model, par):
                        layout = par if ep == 1 else replace(par, ep=ep)
                        mode = choose_recompute(model, hardware, tokens=context, schedule=kind,
                                                tp=tp, cp=cp, pp=pp, vpp=vpp, dp=par.dp,
                                                slices=slices, ep=ep)
                        if mode is not None:
                            out.append(Candidate(parallel=layout, recompute=mode))
    return out


def _expert_degrees(model: ModelSpec, parallel: ParallelSpec) -> list[int]:
    """1, and for an MoE model at tp = 1 every power of two dividing dp*cp and the experts."""
    if not model.is_moe or parallel.tp != 1:
        return [1]
    ranks = parallel.dp * parallel.cp
    return [ep for ep in _powers_of_two(ranks)
            if ranks % ep == 0 and model.num_experts % ep == 0]


def estimate_fixed_length_step(cost: CostModel, lengths: Sequence[int], candidate: Candidate,
                               context: int, *, cache: dict | None = None) -> float:
    """Rough step seconds of fixed-length packing under ``candidate`` (for ranking only):
    concat-and-chunk to ``context``, deal chunks to replicas, 1F1B-style pipeline estimate,
    plus the ring-attention KV exchange per CP step priced on the cost model's links.

    ``cache`` (a dict the caller keeps for one batch, cost model and context) reuses the
    chunking and the per-chunk times between layouts that differ only in dp or vpp, and
    between methods: ranking every layout of several methods is then cheap.
    """
    par = candidate.parallel
    cache = {} if cache is None else cache
    chunks = cache.get("chunks")
    if chunks is None:
        chunks = cache["chunks"] = [[end - start for _, start, end in chunk]
                                    for chunk in concat_and_chunk(lengths, context)]
    key = (par.tp, par.cp, par.pp, par.gpus_per_node, candidate.recompute)
    times = cache.get(key)
    if times is None:
        kv_bytes_per_token = 2 * 2 * cost.model.kv_dim / par.tp
        layers = max(cost.model.num_layers // par.pp, 1)
        times = []
        for docs in chunks:
            t = microbatch_stage_times(cost, docs, tp=par.tp, cp=par.cp, pp=par.pp,
                                       recompute=candidate.recompute)
            comm = 0.0
            if par.cp > 1:
                # Ring attention passes every other rank's K/V once forward, twice backward.
                nbytes = sum(docs) / par.cp * kv_bytes_per_token * layers
                intra = par.tp * par.cp <= par.gpus_per_node
                comm = 3 * cost.comm.all_gather(nbytes * par.cp, par.cp, intra_node=intra)
            times.append(t.forward_s + t.backward_s + comm)
        cache[key] = times
    replicas: list[list[float]] = [[] for _ in range(par.dp)]
    for i, seconds in enumerate(times):
        replicas[i % par.dp].append(seconds)
    return max(pipeline_seconds(r, pp=par.pp, vpp=par.vpp) for r in replicas)
