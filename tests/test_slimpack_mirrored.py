"""SlimPack's search over the backward grouping (issue 24): each slice length is simulated
with its asymmetric backward MicroPacks and with mirrored ones (SlimPipe's reverse order), and
the faster is kept."""

from __future__ import annotations

import pytest

from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.data import sample_batch
from slimpack.sim import simulate
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL, HW = model_preset("llama-13b"), hardware_preset("h800-80g")
COST = default_cost_model(MODEL, HW)
# The batch-size experiment's 2M-token point (32 samples of 64K Common Crawl) at the layout
# SlimPipe won it with: few MicroPacks per replica for 40 virtual stages.
BATCH = sample_batch("commoncrawl", token_budget=32 * 65536, context=65536, seed=0)
PARALLEL = ParallelSpec.for_world(128, tp=2, cp=4, pp=8, vpp=5)


def _plan(**options):
    plan = plan_method("slimpack", BATCH, MODEL, HW, PARALLEL, COST, time_limit_s=None,
                       **options)
    return plan, simulate(plan, model=MODEL, hardware=HW, cost=COST).record


@pytest.fixture(scope="module")
def searched():
    return _plan()


def test_every_simulated_slice_length_is_tried_both_ways_and_the_fastest_is_kept(searched):
    plan, record = searched
    timed = [t for t in plan.metadata["search"] if "step_time_s" in t and "mirrored" in t]
    lengths = {t["slice_tokens"] for t in timed}
    assert len(lengths) >= 2
    for s in lengths:
        assert {t["mirrored"] for t in timed if t["slice_tokens"] == s} == {False, True}
    fastest = min(t["step_time_s"] for t in timed if not t["oom"])
    assert record.step_time_s == pytest.approx(fastest, rel=1e-9)


def test_searching_the_mirrored_grouping_never_loses_to_asymmetric_alone(searched):
    plan, record = searched
    asymmetric, asymmetric_record = _plan(search_mirrored=False)
    assert asymmetric.metadata["slimpack"]["backward"] == "asymmetric"
    assert plan.metadata["slimpack"]["backward"] in ("asymmetric", "mirrored")
    # Under the 792.1 TFLOP/s Hopper GEMM cap the mirrored grouping won here (3.296 s against
    # 3.372 s, S = 12288, bubble 0.128 against 0.157); under the kernel-sourced 719.7 cap the
    # asymmetric one does. Whichever wins, the search holds both.
    assert record.step_time_s <= asymmetric_record.step_time_s * (1 + 1e-9)
    mirrored_steps = [t["step_time_s"] for t in plan.metadata["search"]
                      if t.get("mirrored") and "step_time_s" in t and not t["oom"]]
    assert mirrored_steps  # the mirrored grouping was simulated, not skipped


def test_no_asymmetric_searches_only_mirrored_plans():
    plan, _ = _plan(no_asymmetric=True)
    tried = [t for t in plan.metadata["search"] if "slice_tokens" in t]
    assert {t["mirrored"] for t in tried} == {True}
    # one plan per length and MicroPack floor (no second, mirrored copy)
    assert len({(t["slice_tokens"], t["steady_floor"]) for t in tried}) == len(tried)
    assert plan.metadata["slimpack"]["backward"] == "mirrored"
