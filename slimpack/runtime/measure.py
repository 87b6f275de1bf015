"""Turn the ranks' measurements into one :class:`StepRecord` (the simulator's schema)."""

from __future__ import annotations

import math

from slimpack.cost.flops import mfu, model_flops
from slimpack.records import StepRecord
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.executor import RankResult
from slimpack.runtime.validate import RuntimePlan
from slimpack.specs.hardware import HardwareSpec
from slimpack.specs.model import ModelSpec


def step_record(rplan: RuntimePlan, spec: ModelSpec, results: list[RankResult],
                config: RuntimeConfig, *, hardware: HardwareSpec | None = None,
                hardware_name: str = "") -> StepRecord:
    """Step time is the slowest rank's; peak memory per stage the worst rank's; ops keep
    every rank's timings (``extra["op_ranks"]`` says whose)."""
    plan = rplan.plan
    results = sorted(results, key=lambda r: r.rank)
    step = max(r.elapsed_s for r in results)
    peaks = [0.0] * rplan.pp
    for r in results:
        if r.stage is not None:
            peaks[r.stage] = max(peaks[r.stage], r.peak_memory_bytes)
    busy = [r.busy_s for r in results if r.stage is not None]
    ideal = sum(busy) / len(busy) if busy else 0.0
    bubble = 1.0 - ideal / step if step > 0 else 0.0
    unit_f, unit_b = _unit_times(rplan, results)
    total_f = sum(unit_f)
    imbalance = max(unit_f) * len(unit_f) / total_f if total_f > 0 else 1.0
    lengths = list(plan.sequence_lengths.values())
    # Same numerator as the simulator: the batch's documents under document masks.
    util = (mfu(model_flops(spec, plan.document_lengths().values()), step, plan.world_size,
                hardware.peak_flops)
            if hardware is not None and step > 0 else math.nan)
    ops, op_ranks = [], []
    for r in results:
        ops.extend(r.ops)
        op_ranks.extend([r.rank] * len(r.ops))
    return StepRecord(
        method=plan.method, backend="runtime", model=spec.name,
        hardware=hardware_name or (hardware.name if hardware else config.device),
        parallel=plan.parallel.to_dict(), num_gpus=plan.world_size,
        num_sequences=len(lengths), num_tokens=sum(lengths), step_time_s=step,
        tokens_per_s=sum(lengths) / step if step > 0 else 0.0, mfu=util,
        bubble_fraction=bubble, peak_memory_bytes=tuple(peaks), oom=False,
        imbalance_degree=imbalance, ideal_step_time_s=ideal,
        unit_forward_s=tuple(unit_f), unit_backward_s=tuple(unit_b), ops=tuple(ops),
        extra={"loss": results[0].loss, "dtype": config.dtype,
               "dist_backend": config.dist_backend,
               "attention_backend": results[0].attention_backend,
               "schedule_source": rplan.schedule_source,
               "memory_source": results[0].memory_source, "notes": list(rplan.notes),
               "rank_elapsed_s": [r.elapsed_s for r in results],
               "rank_peak_memory_bytes": [r.peak_memory_bytes for r in results],
               "rank_peak_activation_bytes": [r.activation_peak_bytes for r in results],
               "rank_busy_s": [r.busy_s for r in results], "op_ranks": op_ranks})


def _unit_times(rplan: RuntimePlan, results: list[RankResult]) -> tuple[list[float], list[float]]:
    """Per unit of every group (plan order): its F and B seconds summed over stages and
    chunks, the simulator's ``unit_forward_s`` / ``unit_backward_s``. The ranks of one stage
    (its cp and tp ranks) run each op together, so a stage's op takes its slowest rank's time."""
    per_stage: dict[tuple[str, int, int, int, int], float] = {}
    for r in results:
        for op, gid in zip(r.ops, r.op_groups, strict=True):
            if op.kind in ("F", "B"):
                key = (op.kind, gid, op.unit, op.stage, op.chunk)
                per_stage[key] = max(per_stage.get(key, 0.0), op.end_s - op.start_s)
    fwd: dict[tuple[int, int], float] = {}
    bwd: dict[tuple[int, int], float] = {}
    for (kind, gid, unit, _, _), seconds in per_stage.items():
        target = fwd if kind == "F" else bwd
        target[(gid, unit)] = target.get((gid, unit), 0.0) + seconds
    groups = list(rplan.plan.groups())
    return ([fwd.get((g.group_id, u), 0.0) for g in groups for u in range(len(g.forward_units))],
            [bwd.get((g.group_id, u), 0.0) for g in groups for u in range(len(g.backward_units))])
