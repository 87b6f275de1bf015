"""SlimPack planning time (target: a 2048-sequence batch for 256 GPUs in under 100 ms
median on one core, heuristic mode). Measured by `make bench`; under plain pytest the
benchmark body runs once and only its result is checked."""

from __future__ import annotations

from functools import partial

import pytest

from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

plan = partial(plan_method, "slimpack")

MODEL, HW = model_preset("llama-70b"), hardware_preset("h800")
COST = AnalyticCostModel(model=MODEL, hardware=HW)
PARALLEL = ParallelSpec(tp=8, pp=8, dp=4)  # 256 GPUs


@pytest.fixture(scope="module", params=["commoncrawl", "github"])
def batch(request):
    data = pytest.importorskip("slimpack.data")
    return data.sample_batch(request.param, num_sequences=2048, context=262144, seed=0)


def test_bench_slimpack_heuristic_2048_sequences_256_gpus(benchmark, batch):
    result = benchmark(lambda: plan(batch, MODEL, HW, PARALLEL, COST, search=False))
    result.validate()
    assert result.num_tokens == batch.num_tokens
    assert result.metadata["slimpack"]["peak_bytes"] <= HW.usable_memory_bytes
