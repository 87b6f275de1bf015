"""Asymmetric backward MicroPacks that regroup long-sequence sub-slices (backward.py)."""

import statistics

import pytest

from slimpack.cost.kernel_model import default_cost_model
from slimpack.plan import Group, Phase, Plan, Segment
from slimpack.schedules.orders import backward_order_arrays, forward_order_arrays
from slimpack.schedules.pipeline import _backward_needs, build_schedule
from slimpack.schedules.validate import validate_schedule
from slimpack.sim import simulate
from slimpack.slimpack_planner import SlimPackOptions
from slimpack.slimpack_planner.backward import MIN_SUB_SLICE, backward_cuts, sub_slice_cuts
from slimpack.slimpack_planner.estimate import WorkEstimator
from slimpack.slimpack_planner.micropacks import cost_balanced_cuts, pack_replica
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL = model_preset("llama-7b")
HW = hardware_preset("h800-80g")
COST = default_cost_model(MODEL, HW)
EST = WorkEstimator.from_cost(COST, tp=8, cp=1, cp_sharding="per-sequence")
LENGTH = 256 * 1024


def _segments(cuts):
    return [Segment(seq_id=0, start=a, end=b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def _bwd(seg):
    return EST.backward(seg.num_tokens, seg.start) if seg.start else EST.backward(seg.num_tokens)


def test_backward_cuts_balance_the_backward_that_forward_cuts_leave_uneven():
    fwd_cuts = cost_balanced_cuts(LENGTH, 32, EST)
    segs = _segments(fwd_cuts)
    cuts = backward_cuts(segs, EST)
    assert len(cuts) == len(fwd_cuts) and cuts[0] == 0 and cuts[-1] == LENGTH
    assert all(c % 128 == 0 for c in cuts) and cuts == sorted(set(cuts))
    mirrored = [_bwd(s) for s in segs]
    balanced = [_bwd(s) for s in _segments(cuts)]
    # The kernel model's backward/forward ratio grows with the KV prefix (about 1.3 at the
    # start of a 256K sequence, 2.2 at its end), so equal-forward segments are far apart in
    # backward; the backward cuts bring them within tile rounding.
    assert max(mirrored) / min(mirrored) > 1.5
    assert max(balanced) / min(balanced) < 1.1
    # Backward cuts lie after forward cuts: the late tokens are the dear ones backward.
    assert all(b >= f for f, b in zip(fwd_cuts, cuts, strict=True))


def test_sub_slice_cuts_keep_forward_cuts_and_drop_slivers():
    fwd = [0, 4096, 8192, 12288]
    bwd = [0, 4096 + 256, 8192 + 2048, 12288]
    cuts = sub_slice_cuts(fwd, bwd, MIN_SUB_SLICE)
    assert cuts == [0, 4096, 8192, 10240, 12288]  # 4352 is 256 tokens from 4096: dropped
    assert set(fwd) <= set(cuts)
    assert min(b - a for a, b in zip(cuts[:-1], cuts[1:], strict=True)) >= MIN_SUB_SLICE


def _replica(lengths, asymmetric, **kw):
    target = sum(EST.forward(n) for n in lengths.values()) / kw.pop("units", 24)
    return pack_replica(lengths, EST, slice_tokens=kw.pop("slice_tokens", 8192),
                        round_capacity=kw.pop("capacity", 1 << 30),
                        unit_forward_target=target, asymmetric=asymmetric,
                        regroup_long=kw.pop("regroup_long", True),
                        round_warmup=kw.pop("round_warmup", True), **kw)


def _group(packs, pp=4):
    return Group(group_id=0, ranks=tuple(range(8 * pp)), tp=8, pp=pp, slices=tuple(packs.slices),
                 forward_units=tuple(packs.forward_units),
                 backward_units=tuple(packs.backward_units), schedule="asymmetric")


def _unit_cv(packs, kind):
    by_id = {s.slice_id: s for s in packs.slices}
    units = packs.forward_units if kind == "f" else packs.backward_units
    fn = EST.forward if kind == "f" else EST.backward
    loads = [sum(fn(seg.num_tokens, seg.start) for sid in u.slice_ids for seg in by_id[sid].segments)
             for u in units]
    return statistics.pstdev(loads) / statistics.fmean(loads)


def test_long_only_round_backward_regroups_sub_slices_across_forward_micropacks():
    # Slices long enough that the cuts are cost-balanced (not held to S): forward balanced.
    lengths = {0: LENGTH}
    sym, asym = (_replica(lengths, a, slice_tokens=65536, units=16) for a in (False, True))
    plain = _replica(lengths, True, slice_tokens=65536, units=16, regroup_long=False)
    assert plain.backward_units == sym.backward_units  # regroup_long off: long work mirrored
    group = _group(asym)
    group.validate()
    assert group.is_asymmetric  # no short documents at all: only long work was regrouped
    home = {sid: u for u, unit in enumerate(asym.forward_units) for sid in unit.slice_ids}
    spans = [len({home[sid] for sid in unit.slice_ids}) for unit in asym.backward_units]
    assert max(spans) >= 2  # a backward MicroPack joins pieces of two forward MicroPacks
    # Same forward MicroPacks (a segment priced in two pieces differs by tile rounding only).
    assert _unit_cv(sym, "f") < 0.01 and _unit_cv(asym, "f") < 0.01
    # Mirrored, the backward MicroPacks' CV is about 0.10 (the ratio grows with the prefix);
    # regrouped on backward cost, about 0.003.
    assert _unit_cv(sym, "b") > 0.08 and _unit_cv(asym, "b") < 0.02


def test_mixed_round_plan_validates_schedules_and_round_trips_json():
    lengths = {0: LENGTH, 1: 40000, **{i: 300 + 37 * i for i in range(2, 300)}}
    packs = _replica(lengths, True, units=40)
    group = _group(packs)
    validate_schedule(group, build_schedule(group))
    plan = Plan(method="slimpack", parallel=ParallelSpec(tp=8, pp=4), sequence_lengths=lengths,
                phases=(Phase(groups=(group,)),)).validate()
    again = Plan.from_json(plan.to_json())
    assert again.to_dict() == plan.to_dict()
    g = next(again.groups())
    assert g.is_asymmetric and g.backward_units == group.backward_units


def test_deterministic():
    lengths = {0: LENGTH, **{i: 500 + 91 * i for i in range(1, 200)}}
    a, b = _replica(lengths, True), _replica(lengths, True)
    assert a.slices == b.slices and a.backward_units == b.backward_units


def test_first_backward_of_a_round_needs_its_last_forward_so_the_warm_up_holds():
    # Short documents only: before the fix the first backward MicroPack took the first
    # forward one's atoms (LPT ties), the warm-up shrank to a few steps and the step ran in
    # bursts (6% slower on the attention-heavy mix).
    lengths = {i: 200 + (i * 7919) % 6000 for i in range(600)}
    sym, asym = (_replica(lengths, a, units=48, inflight_tokens=48 * 8192, warmup_units=6)
                 for a in (False, True))
    # The first backward needs as many forwards as the mirror's (its round's last one).
    def first_need(packs):
        group = _group(packs)
        return _backward_needs(group, forward_order_arrays(group)[0],
                               backward_order_arrays(group)[0])[0]
    assert first_need(asym) >= first_need(sym) > 10
    assert first_need(_replica(lengths, True, units=48, inflight_tokens=48 * 8192, warmup_units=6,
                               round_warmup=False)) < 10  # the default: LPT's short warm-up
    times = {}
    for name, packs in (("sym", sym), ("asym", asym)):
        group = _group(packs)
        plan = Plan(method="slimpack", parallel=ParallelSpec(tp=8, pp=4), sequence_lengths=lengths,
                    phases=(Phase(groups=(group,)),))
        times[name] = simulate(plan, model=MODEL, hardware=HW, cost=COST).record.step_time_s
    assert times["asym"] <= times["sym"] * 1.005


def test_short_reserve_leaves_room_for_short_documents_in_long_rounds():
    lengths = {0: 65536, 1: 65536, **{i: 256 + (i * 7919) % 3000 for i in range(2, 400)}}

    def mixed(reserve):
        packs = _replica(lengths, True, slice_tokens=32768, units=20, capacity=140000,
                         short_reserve=reserve)
        by_id = {s.slice_id: s for s in packs.slices}
        kinds = [{lengths[seg.seq_id] > 65536 // 2 for sid in u.slice_ids
                  for seg in by_id[sid].segments} for u in packs.forward_units]
        return sum(k == {True, False} for k in kinds)

    assert mixed(0.3) > mixed(0.0)
    with pytest.raises(ValueError, match="short_reserve"):
        SlimPackOptions(short_reserve=1.0)


def test_ablation_analysis_reports_the_unit_spread_from_the_records():
    import pandas as pd

    from repro.experiments.ablation import _asymmetric_why

    records = pd.DataFrame([
        {"variant": "slicing", "unit_forward_s": "[1.0, 1.0]", "unit_backward_s": "[1.0, 3.0]",
         "bubble_fraction": 0.1},
        {"variant": "+asymmetric", "unit_forward_s": "[1.0, 1.0]", "unit_backward_s": "[2.0, 2.0]",
         "bubble_fraction": 0.05}])
    text = _asymmetric_why(records)
    assert "forward 0.00 -> 0.00, backward 0.50 -> 0.00" in text
    assert "bubble fraction 0.100 -> 0.050" in text
    assert "From these records" not in _asymmetric_why(records.drop(columns="unit_backward_s"))
