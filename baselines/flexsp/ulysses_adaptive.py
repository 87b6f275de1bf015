"""``ulysses-adaptive`` for the method registry (see :mod:`baselines.flexsp.ulysses`)."""

from __future__ import annotations

from baselines.flexsp.method import SP_POOL_RULE, is_sp_pool, sp_pool
from baselines.flexsp.ulysses import UlyssesOptions, plan_adaptive
from slimpack.planning.method import MethodSpec

METHOD = MethodSpec(
    name="ulysses-adaptive", planner=plan_adaptive, options=UlyssesOptions,
    allows=is_sp_pool, reshape=sp_pool, layout_rule=SP_POOL_RULE,
    paper_zero_stage=3,  # as FlexSP's evaluation ran it
    compared=False,  # only FlexSP's own protocol (flexsp-headline) runs it
    summary=("DeepSpeed-Ulysses SP at one degree per step, sized for "
             "the batch's longest sequence (FlexSP's batch-adaptive baseline)"),
    source="FlexSP, arXiv 2412.01523 (its evaluation baselines); DeepSpeed-Ulysses, arXiv 2309.14509")
