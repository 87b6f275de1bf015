"""One record schema for a training step, whether simulated or measured.

The simulator and the runtime both emit :class:`StepRecord`, so simulated-vs-measured error is
a join on the same fields, and the harness writes every record with the same columns.
Times are seconds, memory bytes. Per-stage and per-unit lists are kept in the record (JSON in
CSV cells) because balance plots need them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from slimpack.jsonio import strict_json


@dataclass(frozen=True, kw_only=True, slots=True)
class OpTiming:
    """One executed (or simulated) operation on one pipeline stage."""

    stage: int
    kind: str
    """'F', 'B', 'send', 'recv', 'allreduce', ..."""
    unit: int
    chunk: int
    start_s: float
    end_s: float
    lane: str = "compute"
    """'compute', or a communication lane ('send-next', 'send-prev', 'dp-sync')."""
    group: int = 0
    """Plan group the op belongs to (stage numbers restart in every group)."""


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    method: str
    backend: Literal["sim", "runtime"]
    model: str
    hardware: str
    parallel: dict[str, int]
    num_gpus: int
    num_sequences: int
    num_tokens: int
    step_time_s: float
    tokens_per_s: float
    mfu: float
    bubble_fraction: float
    peak_memory_bytes: tuple[float, ...]
    """Peak per pipeline stage (max over the groups that use that stage)."""
    oom: bool
    imbalance_degree: float
    """WLB-LLM: max unit forward latency * number of units / total forward latency."""
    ideal_step_time_s: float
    """Total compute / devices: no bubbles, no communication, perfect balance."""
    unit_forward_s: tuple[float, ...] = ()
    unit_backward_s: tuple[float, ...] = ()
    plan_seconds: float = 0.0
    ops: tuple[OpTiming, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def step_over_ideal(self) -> float:
        return self.step_time_s / self.ideal_step_time_s if self.ideal_step_time_s else float("nan")

    @property
    def peak_memory_gib(self) -> float:
        return max(self.peak_memory_bytes, default=0.0) / 2**30

    def to_dict(self, *, ops: bool = True) -> dict[str, Any]:
        """Nested dict for JSON: lists and dicts stay lists and objects (not JSON strings)."""
        out = asdict(self)
        if not ops:
            out.pop("ops")
        out["step_over_ideal"] = self.step_over_ideal
        out["peak_memory_gib"] = self.peak_memory_gib
        return out

    def to_json(self, *, indent: int | None = None, ops: bool = True) -> str:
        """Strict JSON: non-finite floats (a NaN memory error, say) are written as null."""
        return strict_json(self.to_dict(ops=ops), indent=indent)

    def to_row(self) -> dict[str, Any]:
        """A flat dict for CSV/W&B: scalars as is, lists and dicts as strict JSON strings."""
        row = self.to_dict(ops=False)
        for key in ("parallel", "peak_memory_bytes", "unit_forward_s", "unit_backward_s", "extra"):
            row[key] = strict_json(row[key])
        return row
