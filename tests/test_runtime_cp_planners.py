"""Registered planners' context-parallel plans, executed on 4 gloo processes, train exactly
like the unsliced single-process model (tiny model, documents of very different lengths).

Each case first checks the plan has the shape it is here for (so a planner change that stops
emitting it fails here instead of silently testing less). Tolerances as in
tests/test_runtime_cp.py: 1e-6 relative loss, 1e-5 norm-relative gradient per parameter.
"""

from __future__ import annotations

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.many import run_plans
from slimpack.runtime.reference import reference_step
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

pytestmark = pytest.mark.slow
TINY = model_preset("tiny")
H100 = hardware_preset("h100-80g")
OUTLIER = (900, 40, 17, 90, 5, 60, 8, 33)  # one document far above the others
MIXED = (300, 40, 17, 90, 5, 120, 60, 8, 33, 150)


def _cp_by_phase(plan) -> list[list[tuple[int, str, str]]]:
    return [sorted({(g.cp, g.cp_kind, g.cp_sharding) for g in p.groups}) for p in plan.phases]


CASES = [
    # Megatron-LM: static cp2 with per-document (THD) sharding.
    ("megatron", dict(cp=2, dp=2), MIXED, 320, [[(2, "ring", "per-document")]]),
    # Megatron-Core hybrid CP: a cp4 round (the 300-token document on every rank), a cp2
    # round (150 | 120, 90) and a round of cp1 groups, one phase each.
    ("megatron-dcp", dict(cp=4), MIXED, 320,
     [[(4, "ring", "per-sequence")], [(2, "ring", "per-sequence")],
      [(1, "ring", "per-sequence")]]),
    # SlimPack DP-Merge: the outlier on both cp2 replicas merged into cp4, then split again.
    ("slimpack", dict(cp=2, dp=2), OUTLIER, 1024,
     [[(4, "ring", "per-sequence")], [(2, "ring", "per-sequence")]]),
    # FlexSP: a Ulysses group of degree 4 for the outlier batch.
    ("flexsp", dict(dp=4), OUTLIER, 1024, [[(4, "ulysses", "per-sequence")]]),
]


@pytest.fixture(scope="module")
def executed():
    """Every case's plan, planned here and run in one job of 4 processes."""
    cost = default_cost_model(TINY, H100)
    plans = [plan_method(method, Batch.from_lengths(lengths), TINY, H100,
                         ParallelSpec(**parallel), cost, context=context)
             for method, parallel, lengths, context, _ in CASES]
    return plans, run_plans(plans, TINY, RuntimeConfig(seed=2), return_grads=True,
                            timeout_s=120)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_planner_cp_plan_matches_unsliced_model(executed, case):
    method, shape = CASES[case][0], CASES[case][4]
    plan, result = executed[0][case], executed[1][case]
    got = _cp_by_phase(plan)
    assert sorted(map(tuple, got)) == sorted(map(tuple, shape)), got
    ref = reference_step(TINY, plan.sequence_lengths, seed=2)
    assert abs(result.loss - ref.loss) <= 1e-6 * abs(ref.loss)
    grads = result.grads()
    assert set(grads) == set(ref.grads)
    worst = max(float((grads[n] - w).norm() / w.norm()) for n, w in ref.grads.items())
    assert worst < 1e-5, f"{method}: max norm-relative gradient error {worst:.2e}"
