"""Simulator speed: it sits inside planners' search loops (docs/architecture.md, simulator).

One step of llama-70b on 256 GPUs (tp 8, pp 8, dp 4, vpp 5), 256K context, 512 sequences of
the heavy-tailed ``wlb-llm`` profile cut into 4K-token slices, one slice per unit (slice-level
units): about 760 slices and 120K simulated ops. Budget: 0.5 s on one core.

    .venv/bin/pytest tests/benchmarks/test_bench_sim.py --benchmark-enable -s
"""

from __future__ import annotations

import time

import pytest

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


GROUP_COSTS_BUDGET_S = 1.0


@pytest.fixture(scope="module")
def paper_scale_plan():
    """One paper-scale SlimPack plan (issue 12): llama-70b, 256 H800 (tp 8, pp 8, dp 4), 512
    Common Crawl samples of 256K tokens (134M tokens, about 65K documents), heuristic
    planning; about 37K units, one group at cp 4."""
    from slimpack import data
    from slimpack.compare import plan_method
    from slimpack.cost import AnalyticCostModel

    model, hardware = model_preset("llama-70b"), hardware_preset("h800")
    batch = data.sample_batch("commoncrawl", token_budget=512 * 262144, context=262144, seed=0)
    cost = AnalyticCostModel(model=model, hardware=hardware)
    return plan_method("slimpack", batch, model, hardware, ParallelSpec(tp=8, pp=8, dp=4), cost,
                       search=False)


@pytest.mark.parametrize("kind", ["analytic", "kernel"])
def test_bench_group_costs_paper_scale(benchmark, paper_scale_plan, kind):
    """Every forward and backward unit of every group priced (``sim.costs.group_costs``).
    Before the one-pass pricing (``unit_prices``) this was ~5 s of a ~6 s simulation."""
    from slimpack.cost import AnalyticCostModel
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.sim.costs import group_costs

    model, hardware = model_preset("llama-70b"), hardware_preset("h800")
    groups = list(paper_scale_plan.groups())

    def price_all():
        # A fresh cost model each time: the kernel model caches token-only prices.
        cost = (AnalyticCostModel(model=model, hardware=hardware) if kind == "analytic"
                else default_cost_model(model, hardware))
        return [group_costs(g, model=model, cost=cost, gpus_per_node=8) for g in groups]

    costs = benchmark(price_all)
    start = time.perf_counter()
    price_all()
    took = time.perf_counter() - start
    units = sum(len(c.fwd_unit_tokens) + len(c.bwd_unit_tokens) for c in costs)
    print(f"\ngroup_costs ({kind}): {units} units in {took:.3f} s")
    assert units > 30_000
    assert sum(sum(c.fwd_unit_tokens) for c in costs) == paper_scale_plan.num_tokens
    if not benchmark.disabled:
        assert took < GROUP_COSTS_BUDGET_S, f"group_costs took {took:.3f} s"
