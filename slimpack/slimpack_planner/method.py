"""SlimPack's declaration for the method registry (slimpack.methods)."""

from __future__ import annotations

from slimpack.planning.method import MethodSpec
from slimpack.slimpack_planner import plan
from slimpack.slimpack_planner.options import SlimPackOptions

METHOD = MethodSpec(
    name="slimpack", planner=plan, options=SlimPackOptions, schedule_family="slimpipe",
    ring_cp_at_layout_degree=True,
    summary="slices and MicroPacks, asymmetric forward/backward partitioning, DP-Merge",
    source="SlimPack, arXiv 2509.26246 (planner details reconstructed: docs/slimpack-planner.md)")
