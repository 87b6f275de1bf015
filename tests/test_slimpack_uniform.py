"""SlimPack's uniform candidate (issue 24: SlimPack's search holds every plan shape SlimPipe's
does): SlimPipe's uniform slices of context-length bins, built with SlimPack's data path and
simulated beside the MicroPack candidates."""

from __future__ import annotations

import pytest

from baselines.slimpipe import SlimPipeOptions
from baselines.slimpipe import plan as slimpipe_plan
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.data import sample_batch
from slimpack.planning.packing import concat_and_chunk, first_fit, sample_pieces
from slimpack.planning.setup import PlanSetup
from slimpack.sim import simulate
from slimpack.slimpack_planner.assemble import BuildContext
from slimpack.slimpack_planner.options import SlimPackOptions
from slimpack.slimpack_planner.uniform import uniform_counts, uniform_plan
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL, HW = model_preset("llama-13b"), hardware_preset("h800-80g")
COST = default_cost_model(MODEL, HW)
CONTEXT = 65536
# GitHub lengths (long documents), 64 samples of 64K on 64 GPUs at pp 8, vpp 5: a deep
# pipeline with 8 samples per replica, where SlimPack's cost-balanced MicroPacks lose to
# SlimPipe's uniform slices on the same pieces (SlimPack 11.82 s without this candidate, SlimPipe 11.55 s).
DOCS = sample_batch("github", token_budget=64 * CONTEXT, context=CONTEXT, seed=0)
PIECES = sample_pieces(DOCS, CONTEXT)
PARALLEL = ParallelSpec.for_world(64, tp=1, cp=1, pp=8, vpp=5)


def test_first_fit_keeps_the_batch_order_and_fills_earlier_gaps():
    assert first_fit([5, 4, 3, 1], 6) == [[0, 3], [1], [2]]
    with pytest.raises(ValueError, match="capacity=4 is shorter"):
        first_fit([5], 4)


def test_first_fit_of_sample_pieces_gives_megatrons_samples():
    chunks = concat_and_chunk(DOCS.lengths, CONTEXT)
    sizes = [len(chunk) for chunk in chunks]
    bins = first_fit(PIECES.lengths, CONTEXT)
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    assert bins == [list(range(s, s + n)) for s, n in zip(starts, sizes, strict=True)]


def _ctx(batch, **options) -> BuildContext:
    return BuildContext(batch=batch, model=MODEL, hardware=HW, parallel=PARALLEL, cost=COST,
                        options=SlimPackOptions(context=CONTEXT, **options))


def test_on_identical_pieces_the_candidate_cuts_slimpipes_slices():
    ctx = _ctx(PIECES)
    counts = uniform_counts(ctx)
    assert len(counts) == 1  # without recompute: the fewest slices that fit, as SlimPipe
    plan, _ = uniform_plan(ctx, num_slices=counts[0])
    setup = PlanSetup(model=MODEL, hardware=HW, parallel=PARALLEL, cost=COST)
    theirs = slimpipe_plan(PIECES, setup, SlimPipeOptions(context=CONTEXT, time_limit_s=None))
    ours_info = plan.metadata["slimpack"]
    assert ours_info["candidate"] == "uniform"
    assert (ours_info["num_slices"], ours_info["slice_tokens"]) == (
        theirs.metadata["num_slices"], theirs.metadata["slice_tokens"])

    def slice_tokens(p):
        return sorted(sl.num_tokens for g in p.groups() for sl in g.slices)

    assert slice_tokens(plan) == slice_tokens(theirs)
    assert {g.schedule for g in plan.groups()} == {"slimpipe"}
    for group in plan.groups():
        # mirrored: every unit one slice, and each sequence's slices backward in reverse
        assert all(len(u.slice_ids) == 1 for u in group.backward_units)
        starts: dict[int, list[int]] = {}
        for unit in group.backward_units:
            for seg in group.slices[unit.slice_ids[0]].segments:
                starts.setdefault(seg.seq_id, []).append(seg.start)
        assert all(s == sorted(s, reverse=True) for s in starts.values())
    plan.validate()
    # Every document whole: one sequence per document, as in every SlimPack plan.
    assert plan.sequence_lengths == {s.seq_id: s.length for s in PIECES.sequences}


@pytest.fixture(scope="module")
def searched():
    plan = plan_method("slimpack", PIECES, MODEL, HW, PARALLEL, COST, time_limit_s=None,
                       context=CONTEXT)
    return plan, simulate(plan, model=MODEL, hardware=HW, cost=COST).record


def test_the_search_simulates_the_candidate_and_keeps_the_fastest(searched):
    plan, record = searched
    tried = plan.metadata["search"]
    uniform = [t for t in tried if t.get("uniform")]
    assert len(uniform) >= 1
    timed = [t["step_time_s"] for t in tried if "step_time_s" in t and not t["oom"]]
    assert record.step_time_s <= min(timed) * (1 + 1e-9)
    # Here it wins: the candidate is the plan SlimPack keeps.
    assert plan.metadata["slimpack"]["candidate"] == "uniform"


def test_slimpack_is_never_slower_than_slimpipe_on_identical_pieces(searched):
    _, record = searched
    setup = PlanSetup(model=MODEL, hardware=HW, parallel=PARALLEL, cost=COST)
    theirs = slimpipe_plan(PIECES, setup, SlimPipeOptions(context=CONTEXT, time_limit_s=None))
    their_step = simulate(theirs, model=MODEL, hardware=HW, cost=COST).record.step_time_s
    # SlimPipe's plan shape with SlimPack's phase 1 (LPT on estimated seconds, where SlimPipe
    # deals samples round robin): 11.36 s against 11.55 s when measured.
    assert record.step_time_s <= their_step * (1 + 1e-9)


def test_switched_off_the_search_builds_no_uniform_candidate():
    plan = plan_method("slimpack", PIECES, MODEL, HW, PARALLEL, COST, time_limit_s=None,
                       context=CONTEXT, uniform_candidate=False, search_candidates=1)
    assert not [t for t in plan.metadata["search"] if t.get("uniform")]
    assert "candidate" not in plan.metadata["slimpack"]


def test_no_pipeline_no_candidate():
    flat = ParallelSpec.for_world(8, tp=1, cp=1, pp=1)
    batch = sample_batch("github", token_budget=8 * CONTEXT, context=CONTEXT, seed=0)
    plan = plan_method("slimpack", batch, MODEL, HW, flat, COST, time_limit_s=None,
                       context=CONTEXT, search_candidates=1)
    assert not [t for t in plan.metadata["search"] if t.get("uniform")]


# llama-70b on Common Crawl at 128K and 256K (512 documents, 128 GPUs): the memory
# experiment's settings, where memory binds at pp 16 and SlimPipe runs selective recompute.
# Each layout is SlimPipe's best one there; on it SlimPack once lost to SlimPipe by 21% and
# 14% on the same pieces (it searched recompute only when its best plan overflowed, built its
# uniform candidate with one slice count, the analytic model's, and dealt it by estimated
# seconds only).
LONG_MODEL = model_preset("llama-70b")
LONG_COST = default_cost_model(LONG_MODEL, HW)


def _long_batch(context: int):
    from repro.experiments.common import draw_batch

    return draw_batch({"model": "llama-70b", "dataset": "commoncrawl", "context": context,
                       "num_gpus": 128, "global_batch": 512, "seed": 0,
                       "hardware": "h800-80g"}, "memory")


def _step(method: str, batch, parallel: ParallelSpec, context: int):
    plan = plan_method(method, batch, LONG_MODEL, HW, parallel, LONG_COST, time_limit_s=None,
                       context=context)
    return plan, simulate(plan, model=LONG_MODEL, hardware=HW, cost=LONG_COST).record


@pytest.mark.parametrize(("context", "cp", "dp"), [(131072, 4, 2), (262144, 8, 1)])
def test_where_memory_binds_slimpack_is_never_slower_than_slimpipe_on_its_layout(context, cp,
                                                                                 dp):
    """On Megatron-LM's sample pieces, the attention work of both methods is the same."""
    parallel = ParallelSpec.for_world(128, tp=1, cp=cp, pp=16, vpp=5)
    assert parallel.dp == dp
    pieces = sample_pieces(_long_batch(context), context)
    _, theirs = _step("slimpipe", pieces, parallel, context)
    plan, ours = _step("slimpack", pieces, parallel, context)
    assert not ours.oom and not theirs.oom
    assert ours.step_time_s <= theirs.step_time_s * (1 + 1e-9)
    # Under recompute the uniform candidate tries several slice counts and both deals (one
    # where a single replica makes them the same plan).
    uniform = [t for t in plan.metadata["search"]
               if t.get("uniform") and t.get("recompute") == "selective"]
    assert len({t["num_slices"] for t in uniform}) >= 2
    assert {t["phase1"] for t in uniform} == ({"lpt", "tokens"} if dp > 1 else {"lpt"})


def test_on_the_pieces_at_128k_slimpack_finds_slimpipes_plan_exactly():
    """SlimPipe's plan there: 32 slices of 4K (the analytic model said 16 fit; the memory walk
    says not), selective recompute, samples dealt by tokens (phase 1's deal by estimated
    seconds runs 1% slower on the same slices). SlimPack's best plan without recompute fits,
    and recompute is searched because memory ruled out a candidate the simulator timed
    faster."""
    parallel = ParallelSpec.for_world(128, tp=1, cp=4, pp=16, vpp=5)
    pieces = sample_pieces(_long_batch(131072), 131072)
    _, theirs = _step("slimpipe", pieces, parallel, 131072)
    plan, ours = _step("slimpack", pieces, parallel, 131072)
    info = plan.metadata["slimpack"]
    assert (info["candidate"], info["num_slices"], info["phase1"]) == ("uniform", 32, "tokens")
    assert {g.recompute for g in plan.groups()} == {"selective"}
    assert ours.step_time_s == pytest.approx(theirs.step_time_s, rel=1e-12)
    without = [t for t in plan.metadata["search"]
               if t.get("recompute") == "none" and "step_time_s" in t]
    fitting = min(t["step_time_s"] for t in without if not t["oom"])
    assert any(t["oom"] and t["step_time_s"] < fitting for t in without)
