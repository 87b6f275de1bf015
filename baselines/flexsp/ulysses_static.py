"""``ulysses-static`` for the method registry (see :mod:`baselines.flexsp.ulysses`)."""

from __future__ import annotations

from baselines.flexsp.method import SP_POOL_RULE, is_sp_pool, sp_pool
from baselines.flexsp.ulysses import UlyssesOptions, plan_static
from slimpack.planning.method import MethodSpec

METHOD = MethodSpec(
    name="ulysses-static", planner=plan_static, options=UlyssesOptions,
    allows=is_sp_pool, reshape=sp_pool, layout_rule=SP_POOL_RULE,
    paper_zero_stage=3,  # as FlexSP's evaluation ran it
    compared=False,  # only FlexSP's own protocol (flexsp-headline) runs it
    summary=("DeepSpeed-Ulysses SP at one degree for the run, sized for "
             "the context's longest sequence (FlexSP's static baseline)"),
    source="FlexSP, arXiv 2412.01523 (its evaluation baselines); DeepSpeed-Ulysses, arXiv 2309.14509")
