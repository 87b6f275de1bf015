"""SlimPack planning time at paper scale (targets of issue 13 and docs/slimpack-planner.md,
"Planning time"). Measured by `make bench`, which prints the three medians (pytest-benchmark
also stores the machine in results/bench); under plain pytest each body runs once (the
search case is skipped) and only the plan is checked.

* 16,384 sequences on one replica (llama-13b, 64K Common Crawl, tp 8 pp 4), heuristic mode:
  target under 200 ms.
* One 134M-token global batch (512 x 256K tokens of Common Crawl, about 65K documents) for
  llama-70b on 256 H800 GPUs (tp 8 pp 8 dp 4): heuristic under 1 s, full search (every
  candidate built and simulated: the limit is set far above it) under 10 s.

Rounds are fixed (``benchmark.pedantic``) so a run takes a known time: the median of 5
heuristic plans, of 3 searches.
"""

from __future__ import annotations

from functools import partial

import pytest

from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

plan = partial(plan_method, "slimpack")

HW = hardware_preset("h800")
NO_LIMIT_S = 3600.0
"""A limit no run reaches: the benchmark times the whole (deterministic) search."""


@pytest.fixture(scope="module")
def data():
    return pytest.importorskip("slimpack.data")


def _run(benchmark, fn, rounds: int):
    if benchmark.disabled:
        return benchmark(fn)  # plain pytest: one call, no statistics
    return benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0)


def test_bench_slimpack_heuristic_16k_sequences_one_replica(benchmark, data):
    model = model_preset("llama-13b")
    cost = AnalyticCostModel(model=model, hardware=HW)
    batch = data.sample_batch("commoncrawl", num_sequences=16384, context=65536, seed=0)
    parallel = ParallelSpec(tp=8, pp=4, dp=1)
    result = _run(benchmark, lambda: plan(batch, model, HW, parallel, cost, search=False), 5)
    result.validate()
    assert result.num_tokens == batch.num_tokens


@pytest.fixture(scope="module")
def paper_batch(data):
    return data.sample_batch("commoncrawl", token_budget=512 * 262144, context=262144, seed=0)


MODEL_70B = model_preset("llama-70b")
COST_70B = AnalyticCostModel(model=MODEL_70B, hardware=HW)
PARALLEL_256 = ParallelSpec(tp=8, pp=8, dp=4)


@pytest.mark.parametrize("search", [False, True], ids=["heuristic", "search"])
def test_bench_slimpack_134m_token_batch_256_gpus(benchmark, paper_batch, search):
    if search and benchmark.disabled:
        pytest.skip("a full search of this batch takes about a minute: `make bench` only")
    result = _run(benchmark, lambda: plan(paper_batch, MODEL_70B, HW, PARALLEL_256, COST_70B,
                                          search=search, time_limit_s=NO_LIMIT_S),
                  3 if search else 5)
    result.validate()
    assert result.num_tokens == paper_batch.num_tokens == 512 * 262144
    assert result.metadata["slimpack"]["peak_bytes"] <= HW.usable_memory_bytes
    if search:  # the whole search ran: every candidate was simulated, or skipped as one
        # that cannot fit memory (the search's over-memory skip, docs/slimpack-planner.md)
        assert all("step_time_s" in t or (t["oom"] and not t["simulated"])
                   for t in result.metadata["search"])
        assert any("step_time_s" in t for t in result.metadata["search"])
