"""SlimPack's plan with SlimPipe's mechanisms (issue 24): activation offload when the searched
plan overflows memory, attention redistribution kept when the simulator times it faster."""

from __future__ import annotations

import pytest

from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.data import sample_batch
from slimpack.sim import simulate
from slimpack.slimpack_planner import SlimPackOptions
from slimpack.slimpack_planner.mechanisms import OFFLOAD_SHARES
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL, HW = model_preset("llama-7b"), hardware_preset("a100-40g")


def _plan(context: int, gpus: int = 4, **options):
    # Real Common Crawl lengths on A100-40G at tp2 pp2: on 4 GPUs (dp 1) the model states
    # leave too little room for the activations; at dp 2 ZeRO-1 halves the optimizer's share.
    cost = default_cost_model(MODEL, HW)
    batch = sample_batch("commoncrawl", num_sequences=16, context=context, seed=0)
    parallel = ParallelSpec.for_world(gpus, tp=2, pp=2)
    plan = plan_method("slimpack", batch, MODEL, HW, parallel, cost, context=context,
                       time_limit_s=None, **options)
    return plan, simulate(plan, model=MODEL, hardware=HW, cost=cost).record


def test_offload_makes_an_overflowing_plan_fit_with_the_smallest_share():
    # Without recompute (recompute="auto" would make this plan fit first: see
    # test_slimpack_recompute.py), offload is what is left.
    without, without_rec = _plan(65536, offload=0.0, recompute="none")
    assert without_rec.oom and without.memory_fits is False
    plan, rec = _plan(65536, recompute="none")
    shares = {g.offload for g in plan.groups()}
    assert len(shares) == 1 and shares <= set(OFFLOAD_SHARES)
    assert not rec.oom and plan.memory_fits is True
    share = shares.pop()
    tried = [t["offload"] for t in plan.metadata["search"] if "offload" in t]
    assert tried == [s for s in OFFLOAD_SHARES if s <= share]  # smaller shares did not fit
    # The copies are charged: offload is slower than the same plan that does not fit.
    assert rec.step_time_s > without_rec.step_time_s


def test_a_plan_that_fits_is_not_offloaded():
    plan, rec = _plan(16384, gpus=8)
    assert not rec.oom and {g.offload for g in plan.groups()} == {0.0}
    assert not [t for t in plan.metadata["search"] if "offload" in t]


def test_attention_redistribution_is_kept_only_when_faster():
    cost = default_cost_model(MODEL, HW)
    plan, rec = _plan(32768, gpus=8)
    other = plan.with_attention_redistribution(not plan.attention_redistribution)
    other_rec = simulate(other, model=MODEL, hardware=HW, cost=cost).record
    assert (rec.oom, rec.step_time_s) <= (other_rec.oom, other_rec.step_time_s)
    assert [t for t in plan.metadata["search"] if "attention_redistribution" in t]
    forced, _ = _plan(32768, gpus=8, attention_redistribution=False)
    assert forced.attention_redistribution is False


@pytest.mark.parametrize("field,value", [("offload", 1.5), ("offload", True),
                                         ("attention_redistribution", "yes")])
def test_bad_mechanism_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"SlimPackOptions.{field}"):
        SlimPackOptions(**{field: value})
