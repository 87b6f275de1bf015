"""Shared planner helpers: packing, rank/group construction, CP sharding, memory fit,
auto-parallel search, time limits. Baselines and the SlimPack solver build on these."""

from slimpack.planning.auto_parallel import (
    Candidate,
    auto_parallel_candidates,
    estimate_fixed_length_step,
)
from slimpack.planning.deadline import WALL_CLOCK_FALLBACK, Deadline
from slimpack.planning.estimates import (
    document_seconds,
    imbalance_degree,
    microbatch_stage_times,
    pipeline_seconds,
)
from slimpack.planning.groups import GroupLayout, packed_group, schedule_for, sliced_group, whole
from slimpack.planning.memory_fit import (
    choose_recompute,
    fits_memory,
    max_tokens_that_fit,
    peak_memory_bytes,
    resolve_recompute,
)
from slimpack.planning.options import build_options
from slimpack.planning.packing import (
    best_fit_decreasing,
    concat_and_chunk,
    contiguous_partition,
    first_fit_decreasing,
    lpt_partition,
    next_power_of_two,
    sorted_batching,
)
from slimpack.planning.ranks import aligned_blocks, num_slots, replica_groups, slot_ranks

__all__ = [
    "WALL_CLOCK_FALLBACK",
    "Candidate",
    "Deadline",
    "GroupLayout",
    "aligned_blocks",
    "auto_parallel_candidates",
    "best_fit_decreasing",
    "build_options",
    "choose_recompute",
    "concat_and_chunk",
    "contiguous_partition",
    "document_seconds",
    "estimate_fixed_length_step",
    "first_fit_decreasing",
    "fits_memory",
    "imbalance_degree",
    "lpt_partition",
    "max_tokens_that_fit",
    "microbatch_stage_times",
    "next_power_of_two",
    "num_slots",
    "packed_group",
    "peak_memory_bytes",
    "pipeline_seconds",
    "replica_groups",
    "resolve_recompute",
    "schedule_for",
    "sliced_group",
    "slot_ranks",
    "sorted_batching",
    "whole",
]
