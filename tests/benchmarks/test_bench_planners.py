"""Planner wall time on a realistic batch (run once with --benchmark-disable)."""

from __future__ import annotations

import pytest

from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL, HW = model_preset("llama-7b"), hardware_preset("h100")
COST = AnalyticCostModel(model=MODEL, hardware=HW)
PARALLEL = ParallelSpec(tp=8, cp=2, pp=4, dp=2)
UNPIPELINED = ParallelSpec(tp=8, cp=2, pp=1, dp=8)
"""The same 128 GPUs at pp = 1, for Megatron-Core's hybrid CP (it refuses pipelines)."""


@pytest.fixture(scope="module")
def batch():
    data = pytest.importorskip("slimpack.data")
    # Issue 8: every planner on a 2048-sequence batch.
    return data.sample_batch("wlb-llm", num_sequences=2048, context=131072, seed=0,
                             truncation="split")


@pytest.mark.parametrize("method", ["naive", "megatron", "megatron-dcp", "wlb-llm", "slimpipe",
                                    "flexsp", "slimpack"])
def test_bench_planner(benchmark, batch, method):
    options = {"search": False} if method == "slimpack" else {"context": 131072, "time_limit_s": 0.2}
    parallel = UNPIPELINED if method == "megatron-dcp" else PARALLEL
    plan = benchmark(lambda: plan_method(method, batch, MODEL, HW, parallel, COST, **options))
    assert plan.num_tokens == batch.num_tokens
