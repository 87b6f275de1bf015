"""Bad plans fail before any process starts, with a message that names the problem."""

from __future__ import annotations

import dataclasses
import time

import pytest

from slimpack.plan import Group, Phase, Plan, PlanError, Unit
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.examples import packed_plan, slimpack_plan
from slimpack.runtime.launch import run_plan
from slimpack.runtime.validate import check_runtime_plan, check_schedule
from slimpack.schedules import Op
from slimpack.specs import ParallelSpec, model_preset

TINY = model_preset("tiny")


def _fails_fast(plan: Plan, match: str, **kwargs) -> None:
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        run_plan(plan, TINY, RuntimeConfig(), **kwargs)
    # Nothing was spawned: spawning even one process takes seconds here.
    assert time.perf_counter() - start < 1.0


def test_plan_for_another_world_size_fails_before_spawning():
    _fails_fast(packed_plan(pp=2, dp=2), r"plan is for 4 processes .* 2 are available",
                nproc=2)


def test_unit_referring_to_a_missing_slice_fails_before_spawning():
    plan = packed_plan(pp=2, dp=1)
    group = next(plan.groups())
    broken = dataclasses.replace(group, forward_units=group.forward_units + (Unit(slice_ids=(7,)),))
    plan = dataclasses.replace(plan, phases=(Phase(groups=(broken,)),))
    _fails_fast(plan, r"refer to missing slices \[7\]")


def test_tensor_and_context_parallel_plans_pass_with_their_stage_and_shard_of_each_rank():
    base = packed_plan(pp=2, dp=1)
    group = next(base.groups())
    parallel = ParallelSpec(tp=2, cp=2, pp=2)
    both = dataclasses.replace(group, tp=2, cp=2, ranks=parallel.replica_ranks(0))
    plan = dataclasses.replace(base, parallel=parallel, phases=(Phase(groups=(both,)),))
    rplan = check_runtime_plan(plan, TINY, world_size=8)
    # Ranks are ordered (pp, cp, tp), tp fastest: stage 0 holds ranks 0-3.
    assert rplan.stage_of_rank == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    assert rplan.tp_index_of_rank == {r: r % 2 for r in range(8)} and rplan.tp == 2
    rplan = check_runtime_plan(packed_plan(pp=2, dp=1, tp=2), TINY, world_size=4)
    assert rplan.stage_of_rank == {0: 0, 1: 0, 2: 1, 3: 1}
    assert rplan.tp_index_of_rank == {0: 0, 1: 1, 2: 0, 3: 1}


def test_layers_must_split_evenly_over_virtual_stages():
    with pytest.raises(ValueError, match="must divide num_layers"):
        check_runtime_plan(packed_plan(pp=2, dp=1, vpp=2), model_preset("tiny-mha"))


def test_schedule_that_deadlocks_is_named():
    group: Group = next(slimpack_plan(pp=2, dp=1).groups())
    # GPipe order (every forward, then every backward) on each stage: valid for any plan.
    ops = [[Op(kind="F", unit=u, chunk=0) for u in range(len(group.forward_units))]
           + [Op(kind="B", unit=u, chunk=0) for u in range(len(group.backward_units))]
           for _ in range(group.pp)]
    # Stage 1 tries a backward before any forward arrived: it can never run.
    ops[1] = [Op(kind="B", unit=0, chunk=0)] + [o for o in ops[1] if o.kind == "F"] + [
        Op(kind="B", unit=1, chunk=0)]
    with pytest.raises(PlanError, match=r"stage 1 at B\(unit 0, chunk 0\)"):
        check_schedule(group, ops)


def test_valid_plans_pass_and_report_their_schedule_source():
    rplan = check_runtime_plan(slimpack_plan(pp=2, dp=2, vpp=2), TINY, world_size=4)
    assert rplan.stage_of_rank == {0: 0, 1: 0, 2: 1, 3: 1}
    assert rplan.num_blocks == 4
    assert rplan.schedule_source == "slimpack.schedules"
