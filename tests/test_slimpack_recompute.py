"""SlimPack's recompute as a searched mechanism (issue 24: SlimPack's search holds every
mechanism SlimPipe's does), and the simulator's memory of full recompute on sliced sequences."""

from __future__ import annotations

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.cost.memory import activation_bytes_per_token_per_layer, kv_bytes_per_token_per_layer
from slimpack.plan import Group, Segment, Slice, Unit
from slimpack.sim import simulate
from slimpack.sim.memory import group_memory
from slimpack.slimpack_planner import SlimPackOptions
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL, HW = model_preset("llama-13b"), hardware_preset("h800-80g")


def test_full_recompute_keeps_the_kv_cache_of_a_sequence_cut_over_several_units():
    """A 4K sequence in two 2K slices (two units) and a 1K document alone in a third: under
    full recompute each slice of the cut sequence keeps its layer input (2h bytes a token)
    and its K,V (the runtime's KV cache, ``runtime/activations.py``); the whole document keeps
    its input only. Hand-computed for llama-13b at tp 1: 2h = 10,240 B, K,V = 20,480 B."""
    slices = (Slice(slice_id=0, segments=(Segment(seq_id=0, start=0, end=2048),)),
              Slice(slice_id=1, segments=(Segment(seq_id=0, start=2048, end=4096),)),
              Slice(slice_id=2, segments=(Segment(seq_id=1, start=0, end=1024),)))
    units = tuple(Unit(slice_ids=(i,)) for i in range(3))
    group = Group(group_id=0, ranks=(0, 1), tp=1, cp=1, pp=2, slices=slices,
                  forward_units=units, backward_units=units, recompute="full")
    memory = group_memory(group, model=MODEL, dp=1, training=None)
    assert activation_bytes_per_token_per_layer(MODEL, "full") == 10_240
    assert kv_bytes_per_token_per_layer(MODEL, 1) == 20_480
    assert memory.fwd_alloc == [2048 * 30_720, 2048 * 30_720, 1024 * 10_240]
    assert memory.bwd_free == memory.fwd_alloc
    # The K,V part is what offload may not move (later slices read it).
    assert memory.kv_share == pytest.approx(4096 * 20_480 / (4096 * 30_720 + 1024 * 10_240))


def _batch() -> Batch:
    # Eight 64K documents among short ones: at pp 2 one 64K sequence's activations without
    # recompute (20 layers x 164,864 B x 64K = 216 GB) overflow an 80 GB GPU, so the plan
    # without recompute must merge replicas for them (DP-Merge).
    return Batch.from_lengths([65536] * 8 + [4096] * 64 + [1024] * 64)


def _plan(recompute: str):
    cost = default_cost_model(MODEL, HW)
    parallel = ParallelSpec.for_world(16, tp=1, pp=2)  # dp 8
    plan = plan_method("slimpack", _batch(), MODEL, HW, parallel, cost, context=65536,
                       time_limit_s=None, recompute=recompute, attention_redistribution=False,
                       offload=0.0)
    return plan, simulate(plan, model=MODEL, hardware=HW, cost=cost).record


def test_auto_recompute_searches_past_a_memory_bound_plan_and_keeps_the_fastest():
    none, none_rec = _plan("none")
    assert none.metadata["slimpack"]["outliers"]  # memory-bound: the 64K sequences merged
    auto, auto_rec = _plan("auto")
    modes = {t.get("recompute") for t in auto.metadata["search"]}
    assert {"none", "selective"} <= modes
    assert not auto_rec.oom
    # The fastest of what it searched: never slower than the plan without recompute, nor than
    # a forced mode it tried.
    assert auto_rec.step_time_s <= none_rec.step_time_s
    selective, selective_rec = _plan("selective")
    assert auto_rec.step_time_s <= selective_rec.step_time_s
    chosen = {g.recompute for g in auto.groups()}
    assert len(chosen) == 1 and auto.metadata["slimpack"]["recompute"] in chosen


def test_a_plan_that_is_not_memory_bound_searches_no_recompute():
    cost = default_cost_model(MODEL, HW)
    batch = Batch.from_lengths([4096] * 64)
    plan = plan_method("slimpack", batch, MODEL, HW, ParallelSpec.for_world(16, tp=4, pp=2),
                       cost, context=65536, time_limit_s=None)
    assert not plan.metadata["slimpack"]["outliers"] and plan.memory_fits
    assert {g.recompute for g in plan.groups()} == {"none"}
    assert not [t for t in plan.metadata["search"] if t.get("recompute", "none") != "none"]


def test_recompute_option_is_checked():
    with pytest.raises(ValueError, match="SlimPackOptions.recompute must be one of"):
        SlimPackOptions(recompute="some")
