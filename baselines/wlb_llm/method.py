"""WLB-LLM's declaration for the method registry."""

from __future__ import annotations

from baselines.wlb_llm.planner import WLBOptions, plan
from slimpack.planning.method import MethodSpec

METHOD = MethodSpec(
    name="wlb-llm", planner=plan, options=WLBOptions,
    ring_cp_at_layout_degree=True,
    summary="variable-length packing, outlier-delay queues, adaptive per-document CP sharding",
    source="WLB-LLM, arXiv 2503.17924")
