"""WLB-LLM (arXiv 2503.17924): workload-balanced 4D parallelism for long-context training."""

from baselines.wlb_llm.outlier_queue import OutlierQueues
from baselines.wlb_llm.planner import WLBOptions, plan

__all__ = ["OutlierQueues", "WLBOptions", "plan"]
