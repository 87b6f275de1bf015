"""Simulator speed: it sits inside planners' search loops (docs/architecture.md, simulator).

One step of llama-70b on 256 GPUs (tp 8, pp 8, dp 4, vpp 5), 256K context, 512 sequences of
the heavy-tailed ``wlb-llm`` profile cut into 4K-token slices, one slice per unit (slice-level
units): about 760 slices and 120K simulated ops. Budget: 0.5 s on one core.

    .venv/bin/pytest tests/benchmarks/test_bench_sim.py --benchmark-enable -s
"""

from __future__ import annotations

import time

from slimpack.data.sampler import sample_batch
from slimpack.sim import simulate
from slimpack.sim.synthetic import sliced_plan
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

BUDGET_S = 0.5


def _plan():
    batch = sample_batch("wlb-llm", num_sequences=512, context=256 * 1024, seed=0)
    parallel = ParallelSpec(tp=8, pp=8, dp=4, vpp=5)
    return sliced_plan(batch.lengths, slice_tokens=4096, parallel=parallel, model="llama-70b")


def test_bench_simulate_llama70b_256gpus(benchmark):
    plan = _plan()
    model, hardware = model_preset("llama-70b"), hardware_preset("h100-80g")
    record = benchmark(lambda: simulate(plan, model=model, hardware=hardware).record)
    # Time it ourselves too: with --benchmark-disable the fixture runs the function once.
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        simulate(plan, model=model, hardware=hardware)
        best = min(best, time.perf_counter() - start)
    nodes = record.extra["num_ops"]
    print(f"\nsimulate: {nodes} ops in {best:.3f} s = {nodes / best:,.0f} nodes/s; "
          f"step {record.step_time_s:.2f} s, bubble {record.bubble_fraction:.1%}, "
          f"MFU {record.mfu:.1%}")
    assert nodes > 100_000
    assert not record.oom
    if not benchmark.disabled:  # a speed target for `make bench`, never a timed unit test
        assert best < BUDGET_S, f"simulate took {best:.3f} s (budget {BUDGET_S} s)"
