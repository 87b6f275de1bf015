"""Activation offload to host: memory, copy time, plan JSON, and SlimPipe choosing it."""

from __future__ import annotations

import dataclasses

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.plan import Phase, Plan, PlanError
from slimpack.sim import simulate
from slimpack.sim.costs import HOST_COPY_EFFICIENCY
from slimpack.sim.memory import group_memory, plan_peak_bytes
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL, HW = model_preset("llama-7b"), hardware_preset("h800")


def _slimpipe(offload: float) -> Plan:
    cost = default_cost_model(MODEL, HW)
    plan = plan_method("slimpipe", Batch.from_lengths([65536] * 2), MODEL, HW,
                       ParallelSpec(tp=2, pp=2), cost, num_slices=4, offload=0.0)
    phases = tuple(Phase(groups=tuple(dataclasses.replace(g, offload=offload)
                                      for g in ph.groups)) for ph in plan.phases)
    return dataclasses.replace(plan, phases=phases)


def test_offload_moves_the_non_kv_activations_off_the_device():
    kept, moved = _slimpipe(0.0), _slimpipe(1.0)
    group = next(moved.groups())
    memory = group_memory(group, model=MODEL, dp=1)
    # Everything but the K,V cache of each slice goes to host after its forward.
    assert memory.fwd_offload[0] == pytest.approx(memory.fwd_alloc[0] * (1 - memory.kv_share))
    assert sum(memory.fwd_offload) == pytest.approx(sum(memory.bwd_fetch))
    peak_kept, peak_moved = plan_peak_bytes(kept, MODEL), plan_peak_bytes(moved, MODEL)
    assert peak_moved < peak_kept
    # The simulator's timed walk and the order-only walk agree with offload too.
    record = simulate(moved, model=MODEL, hardware=HW).record
    assert max(record.peak_memory_bytes) == pytest.approx(peak_moved, rel=1e-9)


def test_a_unit_lasts_at_least_its_host_copy():
    moved = _slimpipe(1.0)
    group = next(moved.groups())
    memory = group_memory(group, model=MODEL, dp=1)
    slow = dataclasses.replace(HW, host_link_gbps=0.5)  # a link so slow the copy dominates
    record = simulate(moved, model=MODEL, hardware=slow).record
    layers = MODEL.num_layers // 2
    copy_s = memory.fwd_offload[0] * layers / (0.5e9 * HOST_COPY_EFFICIENCY)
    assert record.unit_forward_s[0] >= copy_s
    fast = simulate(moved, model=MODEL, hardware=HW).record
    assert fast.step_time_s < record.step_time_s


def test_offload_round_trips_in_plan_json_and_is_checked(tmp_path):
    moved = _slimpipe(0.5)
    path = tmp_path / "plan.json"
    moved.save(path)
    assert next(Plan.load(path).groups()).offload == 0.5
    with pytest.raises(PlanError, match="offload must be a number in"):
        dataclasses.replace(next(moved.groups()), offload=1.5)


def test_slimpipe_offloads_instead_of_full_recompute_at_long_context():
    # llama-7b, two 512K sequences, tp2 cp2 pp2 vpp4 on H800: without offload the plan needs
    # full recompute; with it every activation but the KV cache goes to host and the step is
    # faster (measured 124.5 s -> 101.1 s when this test was written).
    cost = default_cost_model(MODEL, HW)
    batch = Batch.from_lengths([524288] * 2)
    parallel = ParallelSpec(tp=2, cp=2, pp=2, vpp=4)
    recompute = plan_method("slimpipe", batch, MODEL, HW, parallel, cost, offload=0.0)
    auto = plan_method("slimpipe", batch, MODEL, HW, parallel, cost)
    assert recompute.metadata["recompute"] == "full"
    assert (auto.metadata["recompute"], auto.metadata["offload"]) == ("none", 1.0)
    assert auto.memory_fits
    step_r = simulate(recompute, model=MODEL, hardware=HW, cost=cost).record.step_time_s
    step_o = simulate(auto, model=MODEL, hardware=HW, cost=cost).record.step_time_s
    assert step_o < step_r


def test_slimpipe_keeps_the_trial_that_fits_over_a_faster_one_that_does_not():
    """32 Common Crawl samples of 256K on llama-70b, tp2 cp2 pp16 vpp5 (seed 0): the analytic
    estimate admits selective recompute, the simulator's memory walk does not. With two
    trials (offload, then selective recompute at the same slice count) the planner must keep
    the offload trial, not the faster one that finish_plan would escalate to full recompute."""
    from slimpack.data import sample_batch

    model, hw = model_preset("llama-70b"), hardware_preset("h800-80g")
    cost = default_cost_model(model, hw)
    batch = sample_batch("commoncrawl", token_budget=32 * 262144, context=262144, seed=0,
                         truncation="split")
    parallel = ParallelSpec(tp=2, cp=2, pp=16, vpp=5, dp=1)
    plan = plan_method("slimpipe", batch, model, hw, parallel, cost, max_trials=2,
                       time_limit_s=600.0)
    assert (plan.metadata["recompute"], plan.metadata["offload"]) == ("none", 1.0)
    assert plan.memory_fits
    # The trial passed over: selective recompute at that slice count does not fit, so its plan
    # is escalated to full recompute and is slower than the one kept.
    rival = plan_method("slimpipe", batch, model, hw, parallel, cost,
                        num_slices=plan.metadata["num_slices"], offload=0.0)
    assert rival.metadata["recompute"] == "full"
    step = simulate(plan, model=model, hardware=hw, cost=cost).record.step_time_s
    assert step < simulate(rival, model=model, hardware=hw, cost=cost).record.step_time_s
