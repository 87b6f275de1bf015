"""``Plan.zero_stage``: a typed field every planner fills from its recipe, serialised in the
plan JSON (older plans' ``metadata['zero_stage']`` lifted into it), refused with one line
naming the field when out of range, and never priced by the simulator under another stage."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.plan import Plan, PlanError
from slimpack.runtime.examples import flexsp_plan, packed_plan
from slimpack.sim import simulate
from slimpack.sim.memory import plan_fits_memory
from slimpack.specs import ParallelSpec, hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec

TINY = model_preset("tiny")
H100 = hardware_preset("h100-80g")
BATCH = Batch.from_lengths((900, 40, 17, 90, 5, 60, 8, 33))


def test_zero_stage_out_of_range_is_refused_naming_the_field():
    plan = packed_plan(pp=1, dp=2)
    for bad in (2, 4, -1, True, "3"):
        with pytest.raises(PlanError, match=r"^Plan\.zero_stage must be null or one of "
                                            r"\[0, 1, 3\], got ") as err:
            dataclasses.replace(plan, zero_stage=bad)
        assert "\n" not in str(err.value)
    data = plan.to_dict()
    with pytest.raises(PlanError, match=r"^Plan JSON: zero_stage must be null or one of "
                                        r"\[0, 1, 3\], got 2$"):
        Plan.from_dict({**data, "zero_stage": 2})


def test_zero_stage_round_trips_through_json_in_the_current_format():
    for stage in (None, 0, 1, 3):
        plan = dataclasses.replace(packed_plan(pp=1, dp=2), zero_stage=stage)
        data = plan.to_dict()
        assert data["format"] == "slimpack-plan/4" and data["zero_stage"] == stage
        assert Plan.from_json(plan.to_json()) == plan


def test_format_2_plans_have_their_metadata_zero_stage_lifted_into_the_field():
    """FlexSP and the Ulysses baselines wrote ``metadata['zero_stage']`` before format 3."""
    old = {**packed_plan(pp=1, dp=2).to_dict(), "format": "slimpack-plan/2",
           "metadata": {"zero_stage": 3, "plan_seconds": 0.1}}
    old.pop("zero_stage")
    plan = Plan.from_dict(old)
    assert plan.zero_stage == 3 and plan.metadata == {"plan_seconds": 0.1}
    old["metadata"] = {"plan_seconds": 0.1}
    assert Plan.from_dict(old).zero_stage is None  # a format-2 plan that stated none


def test_a_stage_left_in_metadata_is_refused_not_ignored():
    data = {**packed_plan(pp=1, dp=2).to_dict(), "metadata": {"zero_stage": 3}}
    with pytest.raises(PlanError, match=r"metadata\['zero_stage'\] is not read .* "
                                        r"Plan\.zero_stage"):
        Plan.from_dict(data)  # format 3: the field is the one place for it
    with pytest.raises(PlanError, match=r"Plan\.zero_stage"):
        dataclasses.replace(packed_plan(pp=1, dp=2), metadata={"zero_stage": 1})


@pytest.mark.parametrize("method", ["flexsp", "ulysses-adaptive", "megatron", "slimpack"])
def test_planners_state_the_stage_of_the_cost_model_they_were_given(method):
    for stage in (1, 3):
        cost = default_cost_model(TINY, H100, TrainingSpec(zero_stage=stage))
        plan = plan_method(method, BATCH, TINY, H100, ParallelSpec(dp=4), cost, context=1024)
        assert plan.zero_stage == stage, method
        assert "zero_stage" not in plan.metadata


def test_simulator_refuses_a_cost_model_of_another_stage():
    zero3 = default_cost_model(TINY, H100, TrainingSpec(zero_stage=3))
    zero1 = default_cost_model(TINY, H100)
    plan = plan_method("flexsp", BATCH, TINY, H100, ParallelSpec(dp=4), zero3, context=1024)
    assert not simulate(plan, model=TINY, hardware=H100, cost=zero3).record.oom
    match = (r"Plan\.zero_stage=3 but the cost model's TrainingSpec\.zero_stage=1: simulate "
             r"the plan under the recipe it was planned for")
    with pytest.raises(PlanError, match=match):
        simulate(plan, model=TINY, hardware=H100, cost=zero1)
    with pytest.raises(PlanError, match=match):
        plan_fits_memory(plan, TINY, H100, TrainingSpec(zero_stage=1))
    # A plan that states no stage is priced under whatever recipe it is given.
    unstated = flexsp_plan()
    for stage in (0, 1, 3):
        cost = default_cost_model(TINY, H100, TrainingSpec(zero_stage=stage))
        simulate(unstated, model=TINY, hardware=H100, cost=cost)


def test_simulate_cli_prices_a_plan_file_under_the_stage_it_states(tmp_path, capsys):
    from slimpack.cli.main import main

    zero3 = default_cost_model(TINY, H100, TrainingSpec(zero_stage=3))
    plan = plan_method("flexsp", BATCH, TINY, H100, ParallelSpec(dp=4), zero3, context=1024)
    path = tmp_path / "flexsp.json"
    plan.save(path)
    assert main(["simulate", str(path), "--hardware", "h100-80g", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    want = simulate(plan, model=TINY, hardware=H100, cost=zero3).record
    assert printed["step_time_s"] == want.step_time_s
    assert printed["peak_memory_bytes"] == list(want.peak_memory_bytes)
    zero1 = simulate(dataclasses.replace(plan, zero_stage=None), model=TINY, hardware=H100,
                     cost=default_cost_model(TINY, H100)).record
    assert zero1.peak_memory_bytes[0] > want.peak_memory_bytes[0]  # ZeRO-3 shards parameters
