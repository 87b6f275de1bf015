"""SlimPack's declaration for the method registry (slimpack.methods)."""

from __future__ import annotations

from slimpack.planning.method import HARNESS_SEARCH_LAYOUTS, MethodSpec
from slimpack.slimpack_planner import plan
from slimpack.slimpack_planner.options import SlimPackOptions

METHOD = MethodSpec(
    name="slimpack", planner=plan, options=SlimPackOptions, schedule_family="slimpipe",
    ring_cp_at_layout_degree=True, simulates_to_plan=True,  # its search simulates candidates
    # Capped where the harness caps (the 512-sample batches): its exhaustive search there
    # costs 5 to 65 minutes a point; audited by repro.scripts.cap_audit.
    search_layouts=HARNESS_SEARCH_LAYOUTS,
    summary="slices and MicroPacks, asymmetric forward/backward partitioning, DP-Merge",
    source="SlimPack, arXiv 2509.26246 (planner details reconstructed: docs/slimpack-planner.md)")
