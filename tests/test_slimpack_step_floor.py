"""SlimPack's MicroPack count on a small batch (issue 24): the step count follows S down to
pp MicroPacks per replica (SlimPipe's fewest slices per sample), so the search can choose
fewer, larger MicroPacks than 2*pp*vpp where they are faster; it also builds each S with the
steady-state floor of 2*pp*vpp where that binds (deep pipelines lose without it: llama-70b,
2048 Common Crawl documents on 512 GPUs at tp2 cp16 pp16 v5, 7.72 s with the pp floor alone,
6.83 s searched)."""

from __future__ import annotations

from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.data import sample_batch
from slimpack.sim import simulate
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL, HW = model_preset("llama-13b"), hardware_preset("h800-80g")
COST = default_cost_model(MODEL, HW)
# The e2e-throughput smoke point: 16 samples of 64K Common Crawl (512K tokens per replica)
# at the layout SlimPipe won it with, 40 virtual stages.
BATCH = sample_batch("commoncrawl", token_budget=16 * 65536, context=65536, seed=0)
PARALLEL = ParallelSpec.for_world(128, tp=2, cp=4, pp=8, vpp=5)


def _step(method: str, **options) -> tuple[object, float]:
    plan = plan_method(method, BATCH, MODEL, HW, PARALLEL, COST, context=65536,
                       time_limit_s=None, **options)
    return plan, simulate(plan, model=MODEL, hardware=HW, cost=COST).record.step_time_s


def test_a_long_slice_length_gets_fewer_micropacks_than_twice_the_virtual_stages():
    plan, _ = _step("slimpack", slice_tokens=32768, uniform_candidate=False)
    per_replica = [len(g.forward_units) for g in plan.groups()]
    # 512K tokens / 32K = 16 MicroPacks asked for; the old floor forced 2*pp*vpp = 80.
    assert all(PARALLEL.pp <= n < 2 * PARALLEL.pp * PARALLEL.vpp for n in per_replica)


def test_the_steady_state_floor_packs_at_least_twice_the_virtual_stages():
    plan, _ = _step("slimpack", slice_tokens=32768, steady_state_floor=True,
                    uniform_candidate=False)
    assert all(len(g.forward_units) >= 2 * PARALLEL.pp * PARALLEL.vpp for g in plan.groups())


def test_the_search_is_never_slower_than_either_floor_alone():
    searched_plan, searched = _step("slimpack")
    _, pp_floor = _step("slimpack", search_step_floor=False)
    _, steady = _step("slimpack", search_step_floor=False, steady_state_floor=True)
    assert searched <= min(pp_floor, steady) + 1e-9
    tried = [t for t in searched_plan.metadata["search"] if t.get("slice_tokens")]
    assert {t["steady_floor"] for t in tried} == {False, True}  # the floor binds here


def test_the_searched_plan_comes_within_five_percent_of_slimpipe_on_the_small_batch():
    # Measured 1.801 s against SlimPipe's 1.725 s with Hopper bf16 GEMMs capped at 719.7
    # TFLOP/s (1.715 s against 1.673 s under the former 792.1 cap; 2.238 s before the step
    # floor search). Most of the gap is the attention SlimPipe's sample cuts remove (5.1 vs
    # 5.6 PFLOP).
    _, slimpack = _step("slimpack")
    _, slimpipe = _step("slimpipe")
    assert slimpack < 1.05 * slimpipe
