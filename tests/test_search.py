"""The configuration search: a lower bound that holds, and an exhaustive answer that is the
simulator's best layout."""

from __future__ import annotations

import pytest

from slimpack.batch import Batch
from slimpack.compare import (
    best_parallel,
    bound_lengths,
    method_candidates,
    plan_method,
    ring_cp_bound,
    step_lower_bound,
)
from slimpack.cost.kernel_model import default_cost_model
from slimpack.cost.model import AnalyticCostModel
from slimpack.data import sample_batch
from slimpack.methods import DEFAULT_METHODS
from slimpack.planning.winners import layout_key
from slimpack.sim import simulate
from slimpack.specs import hardware_preset, model_preset

MODEL, HW = model_preset("llama-7b"), hardware_preset("h100")
RING_CP_METHODS = [m for m in DEFAULT_METHODS.names()
                   if DEFAULT_METHODS.get(m).ring_cp_at_layout_degree]


def _bound(method, cost, lengths, parallel):
    """The search's own lower bound for ``method`` (with the ring term where it applies)."""
    return step_lower_bound(cost, lengths, parallel,
                            ring_cp=DEFAULT_METHODS.get(method).ring_cp_at_layout_degree)


@pytest.mark.parametrize("make_cost", [default_cost_model,
                                       lambda m, h: AnalyticCostModel(model=m, hardware=h)],
                         ids=["kernel", "analytic"])
@pytest.mark.parametrize("method", ["megatron", "wlb-llm", "slimpipe", "slimpack"])
def test_lower_bound_never_exceeds_a_simulated_step(method, make_cost):
    # Real Wikipedia lengths (FlexSP's sample, shipped profile) on 16 GPUs: every layout the
    # method may use; the bound must hold for each, or pruning could drop the true best.
    cost = make_cost(MODEL, HW)
    batch = sample_batch("wikipedia", num_sequences=96, context=16384, seed=3)
    layouts = method_candidates(method, MODEL, HW, 16, 16384)
    assert len(layouts) >= 5
    for cand in layouts[::2]:
        plan = plan_method(method, batch, MODEL, HW, cand.parallel, cost, context=16384)
        step = simulate(plan, model=MODEL, hardware=HW, cost=cost, validate=False).record
        bound = _bound(method, cost, bound_lengths(DEFAULT_METHODS.get(method), batch, 16384),
                       cand.parallel)
        assert 0 < bound <= step.step_time_s, cand.parallel.describe()


# Documents of one context each, shifted by half a context: each crosses a sample boundary, so
# a method packing fixed-length samples cuts every one in two (half its attention work), and
# one of three contexts, which even full-causal samples cut into three.
CROSSING_CONTEXT = 32768
CROSSING = Batch.from_lengths([CROSSING_CONTEXT // 2] + [CROSSING_CONTEXT] * 12
                              + [3 * CROSSING_CONTEXT, CROSSING_CONTEXT // 2], seed=0)
CROSSING_NO_LONGER = Batch.from_lengths([n for n in CROSSING.lengths if n <= CROSSING_CONTEXT],
                                        seed=0)
REFUSES_LONGER_THAN_CONTEXT = {"naive", "wlb-llm"}
"""Planners that refuse a document longer than the context (naive's default best fit never
cuts one; WLB-LLM's S_max): they get the batch without it."""


def _crossing_batch(method, options):
    return CROSSING_NO_LONGER if method in REFUSES_LONGER_THAN_CONTEXT and not options \
        else CROSSING


def _crossing_steps(method, cost, **options):
    batch = _crossing_batch(method, options)
    for cand in method_candidates(method, MODEL, HW, 16, CROSSING_CONTEXT)[::3]:
        plan = plan_method(method, batch, MODEL, HW, cand.parallel, cost,
                           context=CROSSING_CONTEXT, **options)
        yield cand.parallel, simulate(plan, model=MODEL, hardware=HW, cost=cost,
                                      validate=False).record.step_time_s


def test_the_whole_document_bound_is_no_bound_for_a_method_that_cuts_documents():
    # Why the search prices cut pieces for Megatron-LM: on documents that cross the sample
    # boundaries its plans do less attention than the whole documents need.
    cost = default_cost_model(MODEL, HW)
    below = [p.describe() for p, step in _crossing_steps("megatron", cost)
             if step < step_lower_bound(cost, CROSSING.lengths, p)]
    assert below


@pytest.mark.parametrize("method,options", [
    *[(m, {}) for m in DEFAULT_METHODS.compared_names()],
    ("naive", {"packing": "concat-chunk"})], ids=lambda v: v if isinstance(v, str) else
    ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_each_methods_search_bound_holds_on_documents_that_cross_sample_boundaries(method,
                                                                                   options):
    cost = default_cost_model(MODEL, HW)
    lengths = bound_lengths(DEFAULT_METHODS.get(method), _crossing_batch(method, options),
                            CROSSING_CONTEXT)
    for parallel, step in _crossing_steps(method, cost, **options):
        assert _bound(method, cost, lengths, parallel) <= step, parallel.describe()


@pytest.mark.parametrize("method", sorted(REFUSES_LONGER_THAN_CONTEXT))
def test_the_planners_given_no_longer_document_do_refuse_one(method):
    parallel = method_candidates(method, MODEL, HW, 16, CROSSING_CONTEXT)[0].parallel
    with pytest.raises(ValueError, match="longer|shorter"):
        plan_method(method, CROSSING, MODEL, HW, parallel, default_cost_model(MODEL, HW),
                    context=CROSSING_CONTEXT)


def test_exhaustive_search_returns_the_best_simulated_layout():
    cost = default_cost_model(MODEL, HW)
    batch = sample_batch("commoncrawl", num_sequences=64, context=32768, seed=1)
    found = best_parallel("megatron", batch, MODEL, HW, 16, cost, context=32768)
    assert found.exhaustive and found.simulated + found.pruned == found.candidates
    brute = []
    for cand in method_candidates("megatron", MODEL, HW, 16, 32768):
        plan = plan_method("megatron", batch, MODEL, HW, cand.parallel, cost, context=32768)
        rec = simulate(plan, model=MODEL, hardware=HW, cost=cost).record
        brute.append((rec.oom, rec.step_time_s))
    assert (found.record.oom, found.record.step_time_s) == pytest.approx(min(brute))
    assert found.plan.metadata["parallel_search"]["exhaustive"] is True


def test_a_capped_search_says_it_was_stopped():
    cost = default_cost_model(MODEL, HW)
    batch = Batch.from_lengths([4096, 2000, 1500, 9000, 700, 300] * 4)
    found = best_parallel("megatron", batch, MODEL, HW, 16, cost, context=16384, top_k=1)
    assert found.simulated == 1 and not found.exhaustive
    assert "top_k reached" in found.tried[-1]["stopped"]
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        best_parallel("megatron", batch, MODEL, HW, 16, cost, context=16384, budget_s=0)


@pytest.mark.parametrize("method", ["megatron", "wlb-llm"])
def test_a_capped_searchs_gain_bound_is_a_certificate_the_exhaustive_answer_keeps(method):
    # Capped at 1 layout, the search names every layout it left (bound below its incumbent)
    # and how much faster than its answer any of them could be; the exhaustive search's
    # best must respect that: step_capped / (1 + gain) <= step_exhaustive <= step_capped.
    cost = default_cost_model(MODEL, HW)
    batch = sample_batch("commoncrawl", num_sequences=64, context=32768, seed=1)
    capped = best_parallel(method, batch, MODEL, HW, 16, cost, context=32768, top_k=1)
    full = best_parallel(method, batch, MODEL, HW, 16, cost, context=32768)
    assert not capped.exhaustive and capped.unvisited
    step = capped.record.step_time_s
    lengths = bound_lengths(DEFAULT_METHODS.get(method), batch, 32768)
    bound_of = {layout_key(c.parallel): _bound(method, cost, lengths, c.parallel)
                for c in method_candidates(method, MODEL, HW, 16, 32768)}
    assert all(bound_of[key] == bound for key, bound in capped.unvisited)
    below = [bound for _, bound in capped.unvisited if bound < step]
    assert capped.gain_bound == pytest.approx(step / min(below) - 1 if below else 0.0)
    assert capped.gain_bound >= 0
    assert step / (1 + capped.gain_bound) <= full.record.step_time_s * (1 + 1e-12)
    assert full.record.step_time_s <= step
    assert full.exhaustive and full.unvisited == () and full.gain_bound == 0.0


def test_the_winner_layout_pass_takes_its_layouts_out_of_the_gain_bound():
    from slimpack.compare import extend_search

    cost = default_cost_model(MODEL, HW)
    batch = sample_batch("commoncrawl", num_sequences=64, context=32768, seed=1)
    capped = best_parallel("megatron", batch, MODEL, HW, 16, cost, context=32768, top_k=1)
    left = [c.parallel for c in method_candidates("megatron", MODEL, HW, 16, 32768)
            if layout_key(c.parallel) in {key for key, _ in capped.unvisited}]
    extended = extend_search(capped, "megatron", left, batch, MODEL, HW, 16, cost,
                             context=32768)
    assert extended.unvisited == () and extended.gain_bound == 0.0
    assert extended.record.step_time_s <= capped.record.step_time_s
    assert extended.winner_layouts >= 1


def test_every_method_is_searched_over_slimpipes_deep_pipelines():
    # Deep, interleaved pipelines (vpp up to 5, pp up to 32, SlimPipe's artifact), for the
    # 1F1B methods too (issue 24: they used to get pp <= 16, vpp <= 2).
    model, hw = model_preset("llama-13b"), hardware_preset("h800")
    slimpipe = method_candidates("slimpipe", model, hw, 256, 262144)
    assert (8, 5) in {(c.parallel.pp, c.parallel.vpp) for c in slimpipe}
    # llama-7b's 32 layers take pp 32 (llama-70b's 80 do not divide by it).
    assert max(c.parallel.pp for c in method_candidates("slimpipe", model_preset("llama-7b"),
                                                         hw, 256, 262144)) == 32
    megatron = method_candidates("megatron", model, hw, 256, 262144)
    assert (8, 5) in {(c.parallel.pp, c.parallel.vpp) for c in megatron}


def test_compare_settings_check_their_caps():
    from slimpack.compare import CompareSettings

    assert CompareSettings(auto_parallel_top_k={"slimpack": 2}).top_k_for("slimpack") == 2
    with pytest.raises(ValueError, match="names no cap for 'megatron'"):
        CompareSettings(auto_parallel_top_k={"slimpack": 2}).top_k_for("megatron")
    assert CompareSettings(auto_parallel_top_k={"megatron": None}).top_k_for("megatron") is None
    with pytest.raises(ValueError, match="search_budget_s must be > 0"):
        CompareSettings(search_budget_s=0)
    with pytest.raises(ValueError, match="auto_parallel_top_k must be >= 1"):
        CompareSettings(auto_parallel_top_k={"slimpack": 0})


@pytest.mark.parametrize("method", ["megatron", "megatron-causal", "flexsp"])
def test_unit_prices_shared_between_layouts_change_no_step(method):
    # The search prices each fixed-length sample once per (tp, cp, sharding, recompute):
    # layouts that differ in dp, pp or vpp reuse it, and every step equals a cold simulation.
    cost = default_cost_model(MODEL, HW)
    batch = sample_batch("commoncrawl", num_sequences=64, context=32768, seed=1)
    prices: dict = {}
    for cand in method_candidates(method, MODEL, HW, 16, 32768):
        plan = plan_method(method, batch, MODEL, HW, cand.parallel, cost, context=32768)
        cold = simulate(plan, model=MODEL, hardware=HW, cost=cost).record
        warm = simulate(plan, model=MODEL, hardware=HW, cost=cost, price_cache=prices).record
        again = simulate(plan, model=MODEL, hardware=HW, cost=cost, price_cache=prices).record
        assert cold.step_time_s == warm.step_time_s == again.step_time_s
        assert cold.peak_memory_gib == warm.peak_memory_gib
    assert prices  # something was priced and kept


def test_compare_gives_a_method_its_own_cost_model():
    from slimpack.compare import compare
    from slimpack.specs.training import TrainingSpec

    batch = sample_batch("wikipedia", num_sequences=48, context=16384, seed=3)
    zero3 = default_cost_model(MODEL, HW, TrainingSpec(zero_stage=3))
    rows = compare(["megatron", "flexsp"], batch, MODEL, HW, 16, auto_parallel=True,
                   context=16384, auto_parallel_top_k=2, method_costs={"flexsp": zero3})
    assert [r.zero_stage for r in rows] == [1, 3]
    alone = compare(["flexsp"], batch, MODEL, HW, 16, auto_parallel=True, context=16384,
                    auto_parallel_top_k=2, cost=zero3)
    assert alone[0].step_time_s == rows[1].step_time_s
    with pytest.raises(ValueError, match="method_costs names methods not compared"):
        compare(["megatron"], batch, MODEL, HW, 16, auto_parallel=True, context=16384,
                method_costs={"flexsp": zero3})


def test_the_ring_bound_is_the_kv_traffic_of_every_token_round_the_ring():
    # Hand-computed: llama-7b (32 KV heads of 128) at tp 2 holds 16 heads per rank, so one
    # token's bf16 K and V per layer are 2 * 2 * 16 * 128 = 8192 B. At tp2 cp4 pp2 dp2 the
    # busiest GPU ships 3 * (4 - 1) transfers per layer of its 1/(dp*cp) share of the
    # tokens over NVLink (tp*cp = 8 fits a node), for 32 / 2 = 16 layers, at the kernel
    # model's NCCL bus bandwidth (H100: 450 * 0.82 = 369 GB/s in a node, 50 * 0.94 = 47
    # GB/s across).
    from slimpack.specs import ParallelSpec

    cost = default_cost_model(MODEL, HW)
    assert (cost.comm.hardware.intra_node_gbps, cost.comm.hardware.inter_node_gbps) \
        == pytest.approx((369.0, 47.0))
    tokens = 1 << 20
    parallel = ParallelSpec(tp=2, cp=4, pp=2, dp=2)
    expected = 16 * 9 * (tokens / 8 * 8192) / 369e9
    assert ring_cp_bound(cost, tokens, parallel) == pytest.approx(expected, rel=1e-9)
    # Across nodes (tp*cp = 16 > 8 GPUs per node): the inter-node link.
    wide = ParallelSpec(tp=2, cp=8, pp=1, dp=1)
    assert ring_cp_bound(cost, tokens, wide) == pytest.approx(
        32 * 21 * (tokens / 8 * 8192) / 47e9, rel=1e-9)
    assert ring_cp_bound(cost, tokens, ParallelSpec(tp=8, cp=1, pp=2, dp=1)) == 0.0


@pytest.mark.parametrize("method", RING_CP_METHODS)
def test_methods_with_the_ring_bound_run_every_token_through_a_ring_of_the_layouts_degree(
        method):
    # What ring_cp_at_layout_degree promises, on the plans the bound is applied to: every
    # group rings over at least the layout's cp ranks and no attention moves between stages.
    cost = default_cost_model(MODEL, HW)
    batch = _crossing_batch(method, {})
    layouts = [c.parallel for c in method_candidates(method, MODEL, HW, 16, CROSSING_CONTEXT)
               if c.parallel.cp > 1]
    assert layouts
    for parallel in layouts[::2]:
        plan = plan_method(method, batch, MODEL, HW, parallel, cost, context=CROSSING_CONTEXT)
        groups = [g for phase in plan.phases for g in phase.groups]
        assert all(g.cp_kind == "ring" and g.cp >= parallel.cp for g in groups), \
            parallel.describe()
        trained = sum(seg.num_tokens for g in groups for sl in g.slices for seg in sl.segments)
        assert trained == sum(bound_lengths(DEFAULT_METHODS.get(method), batch,
                                            CROSSING_CONTEXT)), parallel.describe()


def test_the_ring_bound_binds_across_nodes_and_still_holds():
    # The term has teeth: on the cross-node CP layouts of Megatron-LM it is above the compute
    # bound (so the search prunes with it), and the simulated step stays above it.
    cost = default_cost_model(MODEL, HW)
    batch = sample_batch("wikipedia", num_sequences=96, context=16384, seed=3)
    lengths = bound_lengths(DEFAULT_METHODS.get("megatron"), batch, 16384)
    binding = 0
    for cand in method_candidates("megatron", MODEL, HW, 16, 16384):
        p = cand.parallel
        ring = ring_cp_bound(cost, sum(lengths), p)
        if ring <= step_lower_bound(cost, lengths, p):
            continue
        binding += 1
        plan = plan_method("megatron", batch, MODEL, HW, p, cost, context=16384)
        step = simulate(plan, model=MODEL, hardware=HW, cost=cost, validate=False).record
        assert ring <= step.step_time_s, p.describe()
    assert binding >= 2
