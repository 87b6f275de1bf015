"""SlimPack's plans at pp > 1 spread the LM head over the pipeline ranks by default
(``vocab_parallel_pp``); the runtime executes them gradient-exact, as it does the same planner's
plan with the head on the last stage. SlimPipe's plan also spreads the head and asks for
attention redistribution, which the runtime executes (here, priced for the tiny model, the
simulator keeps no move, so it runs as without: tests/test_runtime_redistribution.py runs
plans that move work)."""

from __future__ import annotations

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.many import run_plans
from slimpack.runtime.parity import parity
from slimpack.runtime.reference import reference_step
from slimpack.runtime.validate import check_runtime_plan
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

TINY = model_preset("tiny")
H100 = hardware_preset("h100-80g")
LENGTHS = (300, 40, 17, 90, 5, 120, 60, 8, 33, 150)
OUTLIER = (900, 40, 17, 90, 5, 60, 8, 33)  # one document far above the others: DP-Merge


def _plan(method: str = "slimpack", lengths=LENGTHS, context: int = 320, **options):
    cost = default_cost_model(TINY, H100)
    return plan_method(method, Batch.from_lengths(lengths), TINY, H100,
                       ParallelSpec(pp=2, dp=2), cost, context=context, **options)


def _slimpipe():
    plan = _plan("slimpipe")
    assert plan.attention_redistribution
    return plan


def test_slimpack_default_plan_spreads_the_head_and_is_accepted():
    plan = _plan()
    assert plan.parallel.pp == 2 and all(g.vocab_parallel_pp for g in plan.groups())
    rplan = check_runtime_plan(plan, TINY, world_size=4)
    assert rplan.vocab_over_pp and set(rplan.head_joins) == {g.group_id for g in plan.groups()}


def test_slimpipe_plan_with_redistribution_is_accepted():
    plan = _slimpipe()
    assert all(g.vocab_parallel_pp and g.schedule == "slimpipe" for g in plan.groups())
    assert check_runtime_plan(plan, TINY, world_size=4).moves == {}  # tiny: nothing pays
    check_runtime_plan(plan.with_attention_redistribution(False), TINY,
                       world_size=4)


@pytest.fixture(scope="module")
def executed():
    plans = {
        "slimpack default": _plan(),
        # MicroPacks only: the uniform candidate (SlimPipe's shape) merges no replicas.
        "slimpack default, DP-Merge": _plan(lengths=OUTLIER, context=1024,
                                            uniform_candidate=False),
        "slimpack, head on the last stage": _plan(vocab_parallel_pp=False,
                                                  attention_redistribution=False,
                                                  uniform_candidate=False),
        "slimpipe": _slimpipe(),
    }
    results = run_plans(list(plans.values()), TINY, RuntimeConfig(seed=2), return_grads=True,
                        timeout_s=180)
    return dict(zip(plans, zip(plans.values(), results, strict=True), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["slimpack default", "slimpack default, DP-Merge",
                                  "slimpack, head on the last stage",
                                  "slimpipe"])
def test_planner_pp2_plan_runs_gradient_exact(executed, name):
    plan, result = executed[name]
    assert plan.parallel.pp == 2
    if name == "slimpack default, DP-Merge":  # the outlier on a cp2 pp2 group, then replicas
        assert [sorted({g.cp for g in ph.groups}) for ph in plan.phases] == [[2], [1]]
    assert all(g.vocab_parallel_pp for g in plan.groups()) == (name != "slimpack, head on the "
                                                                        "last stage")
    ref = reference_step(TINY, plan.sequence_lengths, seed=2)
    check = parity(result.loss, result.grads(), ref.loss, ref.grads)
    assert check.ok, check.describe()
