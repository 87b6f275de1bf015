"""FlexSP's declaration for the method registry: its layouts are SP pools."""

from __future__ import annotations

from collections.abc import Sequence

from baselines.flexsp.planner import FlexSPOptions, plan
from slimpack.planning.auto_parallel import Candidate
from slimpack.planning.method import MethodSpec
from slimpack.specs import ParallelSpec


def sp_pool(candidates: Sequence[Candidate]) -> list[Candidate]:
    """FlexSP sizes its SP groups per micro-batch and does not pipeline, so a memory-feasible
    (tp, cp, pp=1, dp) layout is, for FlexSP, the pool of tp x (cp*dp) GPUs: the static cp
    folds into the dp*cp slots its groups are carved from (arXiv 2412.01523, section 3)."""
    out: dict[tuple[int, int], Candidate] = {}
    for c in candidates:
        p = c.parallel
        if p.pp != 1 or p.vpp != 1:
            continue
        pool = ParallelSpec(tp=p.tp, cp=1, pp=1, dp=p.cp * p.dp, gpus_per_node=p.gpus_per_node)
        out.setdefault((p.tp, pool.dp), Candidate(parallel=pool, recompute=c.recompute))
    return list(out.values())


def is_sp_pool(parallel: ParallelSpec) -> bool:
    """The SP methods (FlexSP and the Ulysses baselines) run on a pool without pipeline or
    context parallelism: the pool's sequence-parallel groups replace both."""
    return parallel.pp == 1 and parallel.cp == 1 and parallel.vpp == 1


SP_POOL_RULE = "pp = 1, vpp = 1, the layout's cp folded into dp (an SP pool of tp x dp*cp GPUs)"
"""``is_sp_pool`` and ``sp_pool`` in words (``MethodSpec.layout_rule``)."""


METHOD = MethodSpec(
    name="flexsp", planner=plan, options=FlexSPOptions, allows=is_sp_pool, reshape=sp_pool,
    layout_rule=SP_POOL_RULE,
    paper_zero_stage=3,  # FlexSP ran every SP method with ZeRO-3 (arXiv 2412.01523, evaluation)
    summary="heterogeneous Ulysses SP groups per micro-batch chosen by a MILP (HiGHS)",
    source="FlexSP, arXiv 2412.01523")
