"""Method-specific rules of naive, megatron, megatron-dcp and slimpipe (docs/methods.md)."""

from __future__ import annotations

from functools import partial

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

megatron_plan = partial(plan_method, "megatron")
dcp_plan = partial(plan_method, "megatron-dcp")
naive_plan = partial(plan_method, "naive")
slimpipe_plan = partial(plan_method, "slimpipe")
MODEL, HW = model_preset("llama-7b"), hardware_preset("h100")
COST = AnalyticCostModel(model=MODEL, hardware=HW)
BATCH = Batch.from_lengths([30000, 9000, 7000, 5000, 4000, 3000, 1500, 1200, 800, 500] * 4)


def test_megatron_packs_exactly_context_tokens_per_microbatch():
    par = ParallelSpec(tp=8, cp=2, pp=4, dp=2)
    p = megatron_plan(BATCH, MODEL, HW, par, COST, context=16384)
    sizes = [s.num_tokens for g in p.groups() for s in g.slices]
    assert sizes.count(16384) == len(sizes) - 1 and max(sizes) == 16384
    assert p.num_tokens == BATCH.num_tokens
    assert {g.schedule for g in p.groups()} == {"1f1b"}
    # Cut documents become independent sequences (document masks) mapped back to their source.
    for new_id, (orig, offset) in p.documents.pieces.items():
        assert new_id not in BATCH._lengths and offset > 0 and orig in BATCH._lengths


def test_megatron_turns_on_recompute_only_when_memory_forces_it():
    small = megatron_plan(BATCH, MODEL, HW, ParallelSpec(tp=8, pp=4, dp=2), COST, context=16384)
    assert small.metadata["recompute"] == "none"
    huge = Batch.from_lengths([524288] * 2)
    big = megatron_plan(huge, MODEL, HW, ParallelSpec(tp=8, pp=2, dp=1, vpp=2), COST)
    assert big.metadata["recompute"] in ("selective", "full")
    assert {g.schedule for g in big.groups()} == {"interleaved"}


@pytest.mark.parametrize("packing", ["concat-chunk", "ffd", "bfd", "sorted"])
def test_naive_packings_fixed_count(packing):
    par = ParallelSpec(tp=2, pp=2, dp=2)
    p = naive_plan(BATCH, MODEL, HW, par, COST, packing=packing, context=32768,
                   microbatches_per_rank=3)
    assert all(len(g.forward_units) <= 3 for g in p.groups())
    assert p.num_tokens == BATCH.num_tokens


def test_dcp_plans_one_phase_per_round_and_one_document_per_microbatch():
    par = ParallelSpec(tp=2, cp=4, pp=1, dp=2)
    p = dcp_plan(BATCH, MODEL, HW, par, COST, context=32768)
    assert p.metadata["capacity_tokens"] == 8192 and p.metadata["num_phases"] == len(p.phases)
    for phase in p.phases:  # every tp x dp x cp rank in exactly one group of each round
        assert sorted(r for g in phase.groups for r in g.ranks) == list(range(par.world))
        for g in phase.groups:
            assert g.pp == 1 and g.schedule == "1f1b"
            assert all(len(s.segments) == 1 and s.segments[0].start == 0 for s in g.slices)
    assert p.num_tokens == BATCH.num_tokens


@pytest.mark.parametrize("parallel", [dict(pp=2), dict(pp=2, vpp=2)])
def test_dcp_refuses_pipeline_parallelism_as_megatron_core_does(parallel):
    with pytest.raises(ValueError, match="parallel.pp=2.*pp = 1 and vpp = 1 only"):
        dcp_plan(BATCH, MODEL, HW, ParallelSpec(tp=8, cp=2, dp=2, **parallel), COST)


def test_slimpipe_uniform_slices_and_reverse_backward():
    par = ParallelSpec(tp=8, pp=4, dp=2)
    p = slimpipe_plan(BATCH, MODEL, HW, par, COST, context=32768)
    n, length = p.metadata["num_slices"], p.metadata["slice_tokens"]
    assert n >= par.pp and length % 128 == 0
    for g in p.groups():
        assert g.schedule == "slimpipe" and g.vocab_parallel_pp
        assert max(s.num_tokens for s in g.slices) <= length
        # Same units both ways, but backward runs each sample's slices in reverse order.
        fwd = [u.slice_ids[0] for u in g.forward_units]
        bwd = [u.slice_ids[0] for u in g.backward_units]
        assert bwd[:n] == fwd[:n][::-1] and sorted(fwd) == sorted(bwd)
    assert p.attention_redistribution is True


def test_dcp_capacity_default_places_a_document_longer_than_the_context():
    # 30000 tokens at context 8192 on cp2 x dp2: static CP's 4096 a rank would need 8 ranks of
    # 4; the default rises to ceil(30000 / 4) and a capacity given too small is refused.
    par = ParallelSpec(tp=8, cp=2, pp=1, dp=2)
    p = dcp_plan(BATCH, MODEL, HW, par, COST, context=8192)
    assert p.metadata["capacity_tokens"] == 7500
    with pytest.raises(ValueError, match="capacity_tokens=4096.*at least 7500"):
        dcp_plan(BATCH, MODEL, HW, par, COST, context=8192, capacity_tokens=4096)
