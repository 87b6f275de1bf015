"""Simulated against measured: how far the simulator's step time and peak memory are from a
real run of the same plan. Used by ``slimpack run --calibration`` and the GPU check.

It validates the simulator against the runtime, so it sits in the validation layer, above both:
``slimpack.sim`` and ``slimpack.runtime`` are sibling layers that must not import each other,
and the CLI is the top layer that library code must not import."""

from __future__ import annotations

from slimpack.records import StepRecord


def compare_with_simulator(record: StepRecord, plan, spec, cost) -> dict[str, float]:  # noqa: ANN001
    """Simulate ``plan`` with ``cost`` and return relative errors (sim - real) / real.

    ``memory_error`` is NaN when the run measured no memory (strict JSON writes it as null).
    """
    from slimpack.sim import simulate  # the simulator is heavy; only this function needs it

    sim = simulate(plan, model=spec, hardware=cost.hardware, cost=cost).record
    real_mem = max(record.peak_memory_bytes)
    sim_mem = max(sim.peak_memory_bytes)
    return {"sim_step_s": sim.step_time_s, "real_step_s": record.step_time_s,
            "step_error": (sim.step_time_s - record.step_time_s) / record.step_time_s,
            "sim_peak_bytes": sim_mem, "real_peak_bytes": real_mem,
            "memory_error": (sim_mem - real_mem) / real_mem if real_mem else float("nan")}
