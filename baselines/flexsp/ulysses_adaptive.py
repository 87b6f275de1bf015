"""``ulysses-adaptive`` for the method registry (see :mod:`baselines.flexsp.ulysses`)."""

from __future__ import annotations

from baselines.flexsp.method import sp_pool
from baselines.flexsp.ulysses import UlyssesOptions, plan_adaptive
from slimpack.planning.method import MethodSpec
from slimpack.specs import ParallelSpec


def _pool_without_pipeline(parallel: ParallelSpec) -> bool:
    return parallel.pp == 1 and parallel.cp == 1 and parallel.vpp == 1


METHOD = MethodSpec(
    name="ulysses-adaptive", planner=plan_adaptive, options=UlyssesOptions,
    allows=_pool_without_pipeline, reshape=sp_pool,
    summary=("DeepSpeed-Ulysses SP at one degree per step, sized for "
             "the batch's longest sequence (FlexSP's batch-adaptive baseline)"),
    source="FlexSP, arXiv 2412.01523 (its evaluation baselines); DeepSpeed-Ulysses, arXiv 2309.14509")
