"""The method registry, typed planner options, and the one memory check planners share with
the simulator."""

from __future__ import annotations

import dataclasses
import random

import pytest

from slimpack.batch import Batch
from slimpack.compare import best_parallel, method_candidates, plan_method
from slimpack.cost.model import AnalyticCostModel, training_of
from slimpack.methods import METHODS, get_method, method_names
from slimpack.planning.options import parse_options
from slimpack.planning.setup import PlanSetup
from slimpack.sim import simulate
from slimpack.specs import ParallelSpec, hardware_preset, model_preset


def test_every_registered_method_declares_itself_consistently():
    for name in method_names():
        spec = get_method(name)
        assert spec.name == name
        fields = {f.name for f in dataclasses.fields(spec.options)}
        assert {"context", "time_limit_s"} <= fields, name
        assert spec.summary and spec.source
    assert list(METHODS) == method_names()
    with pytest.raises(ValueError, match="unknown method 'x'; allowed: reference, naive"):
        get_method("x")


def test_each_method_declares_its_harness_search_budget_as_a_count():
    from repro.experiments.common import harness_caps

    # Exhaustive (every layout the bound does not prune) for every method, so no method is
    # searched less than another: a capped baseline could only inflate SlimPack's ratios.
    assert set(harness_caps(method_names()).values()) == {None}
    # Where the harness caps (the 512-sample batches), SlimPack alone: its exhaustive search
    # there costs minutes a point, and a capped SlimPack can only understate its ratios.
    capped = harness_caps(method_names(), capped=True)
    assert {m: cap for m, cap in capped.items() if cap is not None} == {"slimpack": 3}
    assert harness_caps(("megatron:1f1b", "slimpack:no-merge"), capped=True) == {
        "megatron:1f1b": None, "slimpack:no-merge": 3}
    spec = get_method("naive")
    for bad in (0, 2.5, True, "3"):
        with pytest.raises(ValueError, match="search_layouts must be an int >= 1 or None"):
            dataclasses.replace(spec, search_layouts=bad)


def test_method_layouts_come_from_the_spec():
    model, hw = model_preset("llama-7b"), hardware_preset("h100")
    flexsp = method_candidates("flexsp", model, hw, 16, 16384)
    assert flexsp and all(c.parallel.pp == 1 and c.parallel.cp == 1 for c in flexsp)
    # The SP pool folds cp into dp: every tp of the 1F1B candidates at pp 1 is represented.
    tps = {c.parallel.tp for c in method_candidates("megatron", model, hw, 16, 16384)
           if c.parallel.pp == 1}
    assert {c.parallel.tp for c in flexsp} == tps
    assert all(c.parallel.pp > 1 for c in method_candidates("slimpipe", model, hw, 16, 16384))


def test_parse_options_types_every_field_kind():
    slimpack = get_method("slimpack").options
    got = parse_options(slimpack, "slimpack", ["search=false", "slice-tokens=4096",
                                               "slice_candidates=2048, 4096",
                                               "memory_headroom=0.8", "cp_sharding=per-document"])
    assert got == {"search": False, "slice_tokens": 4096, "slice_candidates": (2048, 4096),
                   "memory_headroom": 0.8, "cp_sharding": "per-document"}
    assert parse_options(slimpack, "slimpack", ["slice_tokens=none"]) == {"slice_tokens": None}
    for bad, message in [("slice_tokens=4k", "not a int | None|must be an integer"),
                         ("memory_headroom=nan", "finite"), ("search", "key=value"),
                         ("nope=1", "unknown option 'nope'")]:
        with pytest.raises(ValueError, match=message):
            parse_options(slimpack, "slimpack", [bad])
    wlb = get_method("wlb-llm").options
    with pytest.raises(ValueError, match="cannot be set from the command line"):
        parse_options(wlb, "wlb-llm", ["queue_state=x"])


def test_shared_settings_reach_every_planner_and_bad_options_fail_before_planning():
    model, hw = model_preset("tiny"), hardware_preset("h100")
    cost = AnalyticCostModel(model=model, hardware=hw)
    batch = Batch.from_lengths([300, 120, 64, 500, 90, 33])
    parallel = ParallelSpec(pp=2, dp=2)
    for name in method_names():
        # SP-pool methods (FlexSP and its Ulysses baselines) run on a pool without pipeline.
        par = parallel if get_method(name).allows(parallel) else ParallelSpec(dp=4)
        plan = plan_method(name, batch, model, hw, par, cost, context=512, time_limit_s=1.0)
        assert plan.num_tokens == batch.num_tokens, name
        with pytest.raises(ValueError, match="unknown option"):
            plan_method(name, batch, model, hw, par, cost, context=512, bogus=1)


def _random_batch(rng: random.Random, context: int) -> Batch:
    lengths = [min(context, max(16, int(rng.paretovariate(1.1) * 600)))
               for _ in range(rng.randint(8, 40))]
    return Batch.from_lengths(lengths)


@pytest.mark.parametrize("method", method_names())
def test_planners_memory_verdict_is_the_simulators(method):
    """docs/architecture.md: one memory check. A planner's own memory verdict
    (``Plan.memory_fits``, the planner called directly: the baselines escalate recompute
    until it fits) and, for one that gives none, ``plan_method``'s closing both equal the
    simulator's "no OOM" on random batches, on a device small enough that some plans do not
    fit."""
    spec = get_method(method)
    model = model_preset("llama-7b")
    hw = dataclasses.replace(hardware_preset("a100-40g"), memory_gib=30)
    cost = AnalyticCostModel(model=model, hardware=hw)
    rng = random.Random(7)
    layouts = [dict(tp=4, pp=2), dict(tp=2, cp=2, pp=2), dict(tp=8), dict(tp=4)]
    verdicts = []
    for _ in range(6):
        context = rng.choice([8192, 16384, 32768])
        batch = _random_batch(rng, context)
        runnable = [p for p in (ParallelSpec.for_world(8, **kw) for kw in layouts)
                    if spec.allows(p) and not (method.startswith("ulysses") and p.pp > 1)]
        parallel = rng.choice(runnable)
        setup = PlanSetup(model=model, hardware=hw, parallel=parallel, cost=cost)
        own = spec.planner(batch, setup, spec.make_options({"context": context}))
        plan = plan_method(spec.name, batch, model, hw, parallel, cost, context=context)
        record = simulate(plan, model=model, hardware=hw, cost=cost).record
        assert own.memory_fits in (None, plan.memory_fits), method
        assert plan.memory_fits == (not record.oom), (method, parallel.describe(), context)
        # Every planner states the recipe's ZeRO stage itself (a typed field, not metadata).
        assert plan.zero_stage == training_of(cost).zero_stage, method
        assert "zero_stage" not in plan.metadata, method
        verdicts.append(record.oom)
    assert len(verdicts) == 6


def test_best_parallel_is_the_one_search_and_reports_what_it_tried():
    model, hw = model_preset("llama-7b"), hardware_preset("h100")
    cost = AnalyticCostModel(model=model, hardware=hw)
    batch = Batch.from_lengths([4096, 2000, 1500, 9000, 700, 300] * 4)
    found = best_parallel("megatron", batch, model, hw, 8, cost, context=16384, top_k=2,
                          candidate_filter=lambda c: c.parallel.vpp == 1)
    simulated = [t for t in found.tried if "step_time_s" in t]
    assert found.parallel.vpp == 1 and len(simulated) == 2 == found.simulated
    assert min(t["step_time_s"] for t in simulated) == pytest.approx(found.record.step_time_s)
    with pytest.raises(ValueError, match="no parallel configuration"):
        best_parallel("megatron", batch, model, hw, 8, cost, context=16384,
                      candidate_filter=lambda c: False)
