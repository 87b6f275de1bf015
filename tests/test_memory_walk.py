"""The memory walk from forward counts (no op lists) is the op-list walk, float for float,
and both are the walk written out op by op (the oracle below).

Planners read every candidate group's peak from :func:`peak_bytes_from_counts`; the simulator
reads it from the op lists it times. Both must give the same bytes (the planner's "fits" is
the simulator's "no OOM"), so the check here is exact equality, over the groups every
registered planner makes on real length samples, with offload and every vpp-1 schedule kind.
"""

from __future__ import annotations

import dataclasses

import pytest

from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.cost.memory import activation_bytes_per_token_per_layer, kv_bytes_per_token_per_layer
from slimpack.methods import method_names
from slimpack.plan import Group, Plan
from slimpack.schedules import Op, build_schedule, stage_forward_counts
from slimpack.sim.costs import layers_per_virtual_stage
from slimpack.sim.memory import (
    group_memory,
    op_list_peaks,
    peak_bytes_by_stage,
    peak_bytes_from_counts,
    schedule_peak_bytes,
)
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

data = pytest.importorskip("slimpack.data")

MODEL, HW = model_preset("llama-7b"), hardware_preset("h800")
COST = AnalyticCostModel(model=MODEL, hardware=HW)
PARALLEL = ParallelSpec(tp=2, cp=2, pp=4, dp=2)
NO_PIPELINE = ParallelSpec(tp=2, cp=4, pp=1, dp=2)
UNPIPELINED = ("megatron-dcp",)  # and the Ulysses methods: planned on NO_PIPELINE
"""DeepSpeed-Ulysses (FlexSP's baselines) runs without pipeline parallelism."""
DP = 2


def _walked(group: Group) -> list[float]:
    memory = group_memory(group, model=MODEL, dp=DP)
    layers = layers_per_virtual_stage(MODEL.num_layers, group.pp, group.vpp)
    return peak_bytes_by_stage(build_schedule(group), memory, layers)


def _op_by_op(group: Group, *, from_static: bool = True,
              activations_only: bool = False) -> list[float]:
    """The walk as its rule reads: per stage a running total from the static bytes (else 0,
    the timed engine's dynamic bytes), each op adding its terms in order (F: activations,
    then minus the offloaded part; B: fetched activations plus dK/dV buffers, then minus what
    it frees; activations alone: B fetches, then frees), the peak read after every term."""
    memory = group_memory(group, model=MODEL, dp=DP)
    layers = layers_per_virtual_stage(MODEL.num_layers, group.pp, group.vpp)
    peaks = []
    for s, ops in enumerate(build_schedule(group)):
        total = peak = memory.static_bytes[s] if from_static else 0.0
        for op in ops:
            n, u = layers[op.chunk * group.pp + s], op.unit
            if op.kind == "F":
                steps = (memory.fwd_alloc[u] * n, -(memory.fwd_offload[u] * n))
            elif activations_only:
                steps = (memory.bwd_fetch[u] * n, -(memory.bwd_free[u] * n))
            else:
                steps = ((memory.bwd_fetch[u] + memory.kvgrad_alloc[u]) * n,
                         -((memory.kvgrad_free[u] + memory.bwd_free[u]) * n))
            for step in steps:
                total += step
                peak = max(peak, total)
        peaks.append(peak)
    return peaks


def _counted(group: Group) -> list[float]:
    memory = group_memory(group, model=MODEL, dp=DP)
    layers = layers_per_virtual_stage(MODEL.num_layers, group.pp, group.vpp)
    return peak_bytes_from_counts(stage_forward_counts(group), memory, layers)


@pytest.fixture(scope="module")
def plans() -> list[Plan]:
    """Every registered planner's plan of three real length samples (a few seconds)."""
    out = []
    for seed, dataset in enumerate(("commoncrawl", "github", "wikipedia")):
        batch = data.sample_batch(dataset, num_sequences=96, context=65536, seed=seed)
        out.extend(plan_method(m, batch, MODEL, HW,
                               NO_PIPELINE if m in UNPIPELINED or m.startswith("ulysses")
                               else PARALLEL, COST, context=65536)
                   for m in method_names())
    return out


def _variants(group: Group) -> list[Group]:
    """The group as planned, and under every vpp-1 schedule kind that can run it, with and
    without activation offload (which adds a term after each forward)."""
    out = [group, dataclasses.replace(group, offload=0.5)]
    out += [dataclasses.replace(group, schedule=kind)
            for kind in ("gpipe", "1f1b", "interleaved", "asymmetric", "slimpipe")
            if kind != group.schedule]
    return out


def test_counted_peaks_equal_the_op_walk_for_every_method(plans):
    checked = set()
    for plan in plans:
        for group in plan.groups():
            if group.vpp != 1:
                continue
            checked.add(plan.method)
            for variant in _variants(group):
                assert _counted(variant) == _walked(variant), (plan.method, variant.schedule)
    assert checked == set(method_names())  # every planner's groups were compared


def test_op_walk_is_the_walk_op_by_op_for_every_method(plans, interleaved_plans):
    """Exact equality with the oracle, vpp 1 and 2 (the op-list walk is the only one with
    virtual stages), with and without offload."""
    checked = set()
    for plan in [*plans, *interleaved_plans]:
        for group in plan.groups():
            checked.add((plan.method, group.vpp))
            for variant in (group, dataclasses.replace(group, offload=0.5)):
                assert _walked(variant) == _op_by_op(variant), (plan.method, group.vpp)
    assert {(m, 2) for m in ("megatron", "slimpack", "slimpipe")} <= checked


def test_engine_peaks_are_the_walk_op_by_op(plans, interleaved_plans):
    """What the timed engine reads (``op_list_peaks`` from 0 bytes): the dynamic peak and the
    activations-only peak, each equal to its oracle, vpp 1 and 2, with and without offload."""
    for plan in [*plans, *interleaved_plans]:
        for group in plan.groups():
            for variant in (group, dataclasses.replace(group, offload=0.5)):
                memory = group_memory(variant, model=MODEL, dp=DP)
                layers = layers_per_virtual_stage(MODEL.num_layers, variant.pp, variant.vpp)
                dynamic, activations = op_list_peaks(build_schedule(variant), memory, layers)
                assert dynamic == _op_by_op(variant, from_static=False)
                assert activations == _op_by_op(variant, from_static=False,
                                                activations_only=True)


def test_walk_refuses_ops_outside_the_group(plans):
    group = next(g for g in plans[0].groups() if g.pp > 1)
    memory = group_memory(group, model=MODEL, dp=DP)
    layers = layers_per_virtual_stage(MODEL.num_layers, group.pp, group.vpp)
    ops = [list(stage_ops) for stage_ops in build_schedule(group)]
    ops[1][0] = Op(ops[1][0].kind, len(group.forward_units) + len(group.backward_units), 0)
    with pytest.raises(ValueError, match="op_list_peaks: ops must name units below"):
        op_list_peaks(ops, memory, layers)
    ops[1][0] = Op("B", 0, group.vpp)
    with pytest.raises(ValueError, match="chunks below"):
        op_list_peaks(ops, memory, layers)


def _group_memory_slice_by_slice(group: Group) -> dict:
    """``group_memory``'s per-layer bytes as the rule reads, slice by slice in Python floats:
    a slice's activations are its tokens times the bytes per token (plus, under full
    recompute, the K,V it keeps when its sequence spans several backward units); a unit's
    are its slices' summed in the unit's order; a sequence spread over backward units holds
    dK/dV buffers from its first unit to its last."""
    model = MODEL
    a = activation_bytes_per_token_per_layer(model, group.recompute)
    per_token = a / (group.tp * group.cp)
    kv_per_token = kv_bytes_per_token_per_layer(model, group.tp) / group.cp
    act = {sl.slice_id: sum(seg.end - seg.start for seg in sl.segments) * per_token
           for sl in group.slices}
    seq_tokens: dict[int, int] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, unit in enumerate(group.backward_units):
        for sid in unit.slice_ids:
            for seg in group.slice(sid).segments:
                seq_tokens[seg.seq_id] = seq_tokens.get(seg.seq_id, 0) + seg.end - seg.start
                first.setdefault(seg.seq_id, i)
                last[seg.seq_id] = i
    kept = 0.0
    if group.recompute == "full":
        for sl in group.slices:
            cached = sum(seg.end - seg.start for seg in sl.segments
                         if first[seg.seq_id] != last[seg.seq_id])
            if cached:
                act[sl.slice_id] += cached * kv_per_token
                kept += cached * kv_per_token
    nb = len(group.backward_units)
    alloc, free = [0.0] * nb, [0.0] * nb
    for seq, f in first.items():
        if last[seq] != f:
            alloc[f] += seq_tokens[seq] * kv_per_token
            free[last[seq]] += seq_tokens[seq] * kv_per_token
    share = (kept / max(sum(act.values()), 1e-30) if group.recompute == "full"
             else kv_per_token * group.cp * group.tp / a)
    return {"fwd_alloc": [sum([act[s] for s in u.slice_ids]) for u in group.forward_units],
            "bwd_free": [sum([act[s] for s in u.slice_ids]) for u in group.backward_units],
            "kvgrad_alloc": alloc, "kvgrad_free": free, "kv_share": share}


def test_group_memory_is_the_rule_slice_by_slice(plans, interleaved_plans):
    """Exact equality (the planner's fits is the simulator's no OOM), every planner's groups,
    under each recompute mode (full recompute keeps the K,V of spread sequences)."""
    spread = 0
    for plan in [*plans, *interleaved_plans]:
        for group in plan.groups():
            for recompute in ("none", "selective", "full"):
                variant = dataclasses.replace(group, recompute=recompute, offload=0.25)
                got = group_memory(variant, model=MODEL, dp=DP)
                want = _group_memory_slice_by_slice(variant)
                for name, value in want.items():
                    assert getattr(got, name) == value, (plan.method, recompute, name)
                moved = 0.25 * (1.0 - want["kv_share"])
                assert got.fwd_offload == [x * moved for x in want["fwd_alloc"]]
                spread += any(want["kvgrad_alloc"])
    assert spread > 0  # some groups cut sequences over several backward units


@pytest.fixture(scope="module")
def interleaved_plans() -> list[Plan]:
    batch = data.sample_batch("commoncrawl", num_sequences=96, context=65536, seed=3)
    return [plan_method(m, batch, MODEL, HW, dataclasses.replace(PARALLEL, vpp=2), COST,
                        context=65536) for m in ("megatron", "slimpack", "slimpipe")]


def test_counts_are_the_schedule(plans):
    """Forward unit i runs before backward j on stage r exactly when i < count_r(j)."""
    for plan in plans:
        for group in plan.groups():
            if group.vpp != 1:
                continue
            for r, (ops, counts) in enumerate(zip(build_schedule(group),
                                                  stage_forward_counts(group), strict=True)):
                seen_forwards = 0
                j = 0
                for op in ops:
                    if op.kind == "F":
                        seen_forwards += 1
                    else:
                        assert seen_forwards == counts[j], (plan.method, r, j)
                        j += 1
                assert j == len(counts)


def test_schedule_peak_bytes_needs_no_op_lists_without_virtual_stages(plans):
    plan = next(p for p in plans if p.method == "slimpack")
    group = next(plan.groups())
    assert schedule_peak_bytes(group, MODEL, DP) == _walked(group)


def test_stage_forward_counts_rejects_virtual_stages(plans):
    plan = next(p for p in plans if p.method == "slimpack")
    group = dataclasses.replace(next(plan.groups()), vpp=2)
    with pytest.raises(ValueError, match="vpp = 1"):
        stage_forward_counts(group)
