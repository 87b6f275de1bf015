"""FlexSP (arXiv 2412.01523): heterogeneous sequence-parallel groups chosen by a MILP."""

from baselines.flexsp.planner import FlexSPOptions, plan

__all__ = ["FlexSPOptions", "plan"]
