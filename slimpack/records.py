"""One record schema for a training step, whether simulated or measured.

The simulator and the runtime both emit :class:`StepRecord`, so simulated-vs-measured error is
a join on the same fields, and the harness writes every record with the same columns.
Times are seconds, memory bytes. Per-stage and per-unit lists are kept in the record (JSON in
CSV cells) because balance plots need them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
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


STEP_LIST_COLUMNS = ("peak_memory_bytes", "unit_forward_s", "unit_backward_s", "extra")
"""StepRecord fields that a flat row holds as JSON text (one CSV cell each)."""


@dataclass(frozen=True, kw_only=True)
class MethodRecord:
    """One method's answer on one workload: the simulated step of its plan and how the plan was
    found. ``slimpack compare``, every harness experiment and the report read this one type,
    so every method row has the same columns (:data:`METHOD_RECORD_COLUMNS`).

    A method that failed to plan or simulate has ``error`` set and no ``step``: its step
    columns are empty (NaN, or None for ``oom``: a failure has no memory verdict, never
    "fits")."""

    method: str
    step: StepRecord | None
    """The simulated step; None when ``error`` is set."""
    parallel: dict[str, int] | None
    """The layout the method ran on (for FlexSP its SP pool as the search gave it); None when
    it failed before one was known."""
    error: str = ""
    recompute: str = ""
    """The plan's recompute mode(s), comma-separated when groups differ."""
    offload: float = float("nan")
    """The largest activation offload share of any group."""
    zero_stage: int | None = None
    """The recipe the method was priced under (FlexSP's paper: ZeRO-3)."""
    plan_seconds: float = float("nan")
    fallback: str = ""
    """What a planner or search fell back to (never a silent degradation); empty when none."""
    speedup_vs_first: float = float("nan")
    """The first compared method's step time over this one's (``compare`` sets it)."""
    search: str = ""
    """One line on the layout search behind the record, or "fixed layout"."""
    search_exhaustive: bool | None = None
    search_space: str = ""
    layouts_candidates: int | None = None
    layouts_simulated: int | None = None
    layouts_pruned: int | None = None
    layouts_from_winners: int | None = None
    search_gain_bound: float | None = None
    """How much faster than this record a plan on a layout its search did not simulate
    could be (``SearchResult.gain_bound``: 0.03 means at most 3% faster, by the step lower
    bound; 0 for an exhaustive search); None for a fixed layout."""
    runtime_refusal: str = ""
    """Why the PyTorch runtime would refuse to execute this plan (the field it names, from
    :func:`slimpack.runtime.validate.runtime_refusal`); empty when it executes it. A ratio is
    only as good as the plan behind it: this says whether that plan runs."""

    def __post_init__(self) -> None:
        if (self.step is None) != bool(self.error):
            raise ValueError(f"MethodRecord {self.method}: a record has a step or an error, "
                             f"not both and not neither (error={self.error!r})")

    def to_dict(self) -> dict[str, Any]:
        """Every column (:data:`METHOD_RECORD_COLUMNS`), lists and dicts as Python values."""
        if self.step is not None:
            step = self.step.to_dict(ops=False)
        else:
            step = {name: None if name in _NO_VERDICT else float("nan") for name in _STEP_COLUMNS}
        merged = {**step, **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "step"}}
        return {column: merged[column] for column in METHOD_RECORD_COLUMNS}

    def to_row(self) -> dict[str, Any]:
        """A flat row for CSV: scalars as they are (non-finite floats None), lists and dicts as
        strict JSON text (``parallel`` with sorted keys)."""
        row = {}
        for key, value in self.to_dict().items():
            if key == "parallel" and value is not None:
                row[key] = strict_json(value, sort_keys=True)
            elif key in STEP_LIST_COLUMNS and value is not None:
                row[key] = strict_json(value)
            elif isinstance(value, float) and not math.isfinite(value):
                row[key] = None
            else:
                row[key] = value
        return row

    @property
    def step_time_s(self) -> float:
        return self.step.step_time_s if self.step is not None else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.step.tokens_per_s if self.step is not None else float("nan")


_STEP_COLUMNS = tuple(f.name for f in fields(StepRecord) if f.name != "ops") + (
    "step_over_ideal", "peak_memory_gib")
_NO_VERDICT = ("oom", "backend", "model", "hardware", "parallel", "peak_memory_bytes",
               "unit_forward_s", "unit_backward_s", "extra")
"""Step columns a failed method leaves empty rather than NaN."""

METHOD_RECORD_COLUMNS = tuple(dict.fromkeys(
    ("method", *_STEP_COLUMNS, *(f.name for f in fields(MethodRecord) if f.name != "step"))))
"""The one column set of every method row (``MethodRecord.to_row``)."""


def check_method_row(row: dict[str, Any], *, where: str = "") -> None:
    """ValueError naming the columns a method row lacks: every method row carries the whole
    :data:`METHOD_RECORD_COLUMNS` schema (an experiment may add its own columns)."""
    missing = [c for c in METHOD_RECORD_COLUMNS if c not in row]
    if missing:
        raise ValueError(f"{where or 'method row'} {row.get('method', '?')!r} lacks the "
                         f"MethodRecord column(s) {missing}")
