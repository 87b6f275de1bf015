"""Assemble, validate and time-stamp a plan (every baseline ends here)."""

from __future__ import annotations

import time
from typing import Any

from slimpack.plan import Phase, Plan
from slimpack.specs import ModelSpec, ParallelSpec


def finish_plan(*, method: str, model: ModelSpec, parallel: ParallelSpec,
                sequence_lengths: dict[int, int], phases: list[Phase], started: float,
                metadata: dict[str, Any]) -> Plan:
    """Build and validate the plan; ``metadata['plan_seconds']`` is the wall time since
    ``started`` (``time.perf_counter``), validation included."""
    plan = Plan(method=method, model=model.name, parallel=parallel,
                sequence_lengths=dict(sequence_lengths), phases=tuple(phases),
                metadata=dict(metadata))
    plan.validate()
    plan.metadata["plan_seconds"] = time.perf_counter() - started
    return plan
