"""SlimPack's plans at pp > 1 spread the LM head over the pipeline ranks
(``vocab_parallel_pp``), which the runtime refuses by name; with ``vocab_parallel_pp=False``
the same planner's plan keeps the head on the last stage and runs, exactly."""

from __future__ import annotations

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.many import run_plans
from slimpack.runtime.reference import reference_step
from slimpack.runtime.validate import check_runtime_plan
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

TINY = model_preset("tiny")
H100 = hardware_preset("h100-80g")
LENGTHS = (300, 40, 17, 90, 5, 120, 60, 8, 33, 150)


def _plan(**options):
    cost = default_cost_model(TINY, H100)
    return plan_method("slimpack", Batch.from_lengths(LENGTHS), TINY, H100,
                       ParallelSpec(pp=2, dp=2), cost, context=320, **options)


def test_vocab_parallel_pp_is_refused_by_name():
    plan = _plan()
    assert all(g.vocab_parallel_pp for g in plan.groups())
    with pytest.raises(ValueError, match="vocab_parallel_pp"):
        check_runtime_plan(plan, TINY, world_size=4)


@pytest.mark.slow
def test_slimpack_pp2_plan_without_it_runs_gradient_exact():
    plan = _plan(vocab_parallel_pp=False, attention_redistribution=False)
    assert not any(g.vocab_parallel_pp for g in plan.groups()) and plan.parallel.pp == 2
    check_runtime_plan(plan, TINY, world_size=4)
    (result,) = run_plans([plan], TINY, RuntimeConfig(seed=2), return_grads=True,
                          timeout_s=120)
    ref = reference_step(TINY, plan.sequence_lengths, seed=2)
    assert abs(result.loss - ref.loss) <= 1e-6 * abs(ref.loss)
    grads = result.grads()
    assert set(grads) == set(ref.grads)
    worst = max(float((grads[n] - w).norm() / w.norm()) for n, w in ref.grads.items())
    assert worst < 1e-5, f"max norm-relative gradient error {worst:.2e}"
