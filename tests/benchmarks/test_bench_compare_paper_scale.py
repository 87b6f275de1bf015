"""``compare`` of the paper-scale methods at the papers' batch (issue 24, performance target:
under 5 minutes on 2 cores): 512 samples of 256K Common Crawl tokens (134,217,728 tokens)
for llama-70b on 256 H800 GPUs, every method searched over the one layout space
(``SEARCH_SPACE``) with its harness budget at that batch (``harness_caps(..., capped=True)``:
Megatron-LM in both semantics, WLB-LLM and SlimPipe exhaustive, bound-pruned; SlimPack its 3
best-estimated layouts, then the winner-layout pass), no wall-clock limit anywhere, as
``paper-scale`` runs them one method per point.

Minutes of work: only ``make bench`` runs it (one round; the stored JSON keeps the machine),
plain pytest skips it. The records are checked too: every method plans, and the search
covered what the records say. It runs twice: in one process, and with ``jobs=2`` (the
methods in two processes, what ``slimpack compare`` does on a 2-core machine: its ``--jobs``
defaults to the usable CPUs); both give the same records.
"""

from __future__ import annotations

import pytest

from repro.experiments.common import harness_caps, with_harness_options
from repro.experiments.paper_scale import CONTEXT, GPUS, HARDWARE, METHODS, MODEL, SAMPLES
from slimpack.compare import compare, paper_recipe_costs
from slimpack.specs import hardware_preset, model_preset


@pytest.mark.parametrize("jobs", [1, 2], ids=["one-process", "two-processes"])
def test_bench_compare_paper_scale_methods_134m_tokens_256_gpus(benchmark, jobs):
    if benchmark.disabled:
        pytest.skip("minutes of planning: `make bench` only")
    from slimpack import data

    model, hardware = model_preset(MODEL), hardware_preset(HARDWARE)
    batch = data.sample_batch("commoncrawl", token_budget=SAMPLES * CONTEXT, context=CONTEXT,
                              seed=0)
    methods = list(METHODS)
    caps = harness_caps(METHODS, capped=True)

    def run():
        return compare(methods, batch, model, hardware, GPUS, auto_parallel=True,
                       context=CONTEXT, auto_parallel_top_k=caps,
                       method_options=with_harness_options(METHODS, None),
                       method_costs=paper_recipe_costs(methods, model, hardware), jobs=jobs)

    records = benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    assert [r.method for r in records] == methods
    assert not [r.error for r in records if r.error]
    assert all(r.layouts_simulated >= 1 for r in records)
    assert all(r.search_exhaustive for r in records if caps[r.method] is None)
    benchmark.extra_info["steps_s"] = {r.method: r.step_time_s for r in records}
    benchmark.extra_info["layouts_simulated"] = {r.method: r.layouts_simulated for r in records}
