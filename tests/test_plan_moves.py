"""SlimPipe's attention redistribution moves as typed plan data (``Group.attention_moves``):
chosen by the planner under its cost model, written in the plan JSON (slimpack-plan/4),
checked on load, priced as they are by the simulator and executed by the runtime."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.plan import PLAN_FORMATS, Move, Plan, PlanError
from slimpack.runtime.validate import check_runtime_plan
from slimpack.schedules import build_schedule
from slimpack.sim import simulate
from slimpack.sim.redistribution import check_move_ticks, priced_moves
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL = model_preset("llama-13b")
H100, H800 = hardware_preset("h100"), hardware_preset("h800-80g")
COST_H100 = default_cost_model(MODEL, H100)
COST_H800 = default_cost_model(MODEL, H800)


@pytest.fixture(scope="module")
def plan() -> Plan:
    """SlimPipe, llama-13b on H100, tp4 pp4, four slices of eight documents."""
    return plan_method("slimpipe", Batch.from_lengths([65536, 32768, 16384, 8192] * 2), MODEL,
                       H100, ParallelSpec(tp=4, pp=4, dp=1), COST_H100, num_slices=4,
                       attention_redistribution=True)


def _unchosen(plan: Plan) -> Plan:
    """The plan as a format-3 plan reads: redistribution on, no moves."""
    return Plan.from_dict({**_format_3(plan)})


def _format_3(plan: Plan) -> dict:
    data = json.loads(plan.to_json())
    data["format"] = "slimpack-plan/3"
    for ph in data["phases"]:
        for g in ph["groups"]:
            del g["attention_moves"]
    return data


def test_the_planner_fills_the_moves_it_priced(plan):
    (group,) = plan.groups()
    assert group.attention_moves == priced_moves(group, build_schedule(group), model=MODEL,
                                                 cost=COST_H100, gpus_per_node=8)
    assert len(group.attention_moves) == 7


def test_moves_round_trip_through_json(plan):
    data = json.loads(plan.to_json())
    assert data["format"] == PLAN_FORMATS[-1] == "slimpack-plan/4"
    (group,) = plan.groups()
    first = group.attention_moves[0]
    assert data["phases"][0]["groups"][0]["attention_moves"][0] == [
        first.backward, first.tick, first.heavy_block, first.heavy_unit, first.light_block,
        first.light_unit, first.fraction]
    back = Plan.from_json(plan.to_json()).validate()
    assert next(back.groups()).attention_moves == group.attention_moves
    assert back == plan


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.__setitem__(6, 0.0), r"attention_moves\[0\]\.fraction must be in \(0, 1\]"),
    (lambda m: m.__setitem__(6, 1.5), r"attention_moves\[0\]\.fraction must be in \(0, 1\]"),
    (lambda m: m.__setitem__(2, 16), r"attention_moves\[0\]\.heavy_block = 16 is outside \[0, 4\)"),
    (lambda m: m.__setitem__(5, 99), r"attention_moves\[0\]\.light_unit = 99 is outside"),
    (lambda m: m.__setitem__(1, -1), r"attention_moves\[0\]\.tick must be >= 0"),
    (lambda m: m.__setitem__(0, 1), r"attention_moves\[0\]\.backward must be true or false"),
    (lambda m: m.pop(), r"attention_moves\[0\] must be \[backward, tick, heavy_block"),
    (lambda m: m.__setitem__(4, m[2]), r"attention_moves\[0\] pairs two ops of pipeline stage"),
])
def test_malformed_moves_are_refused_naming_the_field(plan, change, message):
    data = json.loads(plan.to_json())
    change(data["phases"][0]["groups"][0]["attention_moves"][0])
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(data).validate()


def test_an_op_in_two_moves_and_moves_without_the_flag_are_refused(plan):
    (group,) = plan.groups()
    m = group.attention_moves[0]
    twice = dataclasses.replace(group, attention_moves=(m, dataclasses.replace(m, tick=m.tick)))
    with pytest.raises(PlanError, match=r"attention_moves\[1\]: the .* op of unit .* is already "
                                        r"in another move"):
        twice.validate()
    off = dataclasses.replace(plan, attention_redistribution=False)
    with pytest.raises(PlanError, match="attention_moves given but Plan.attention_redistribution "
                                        "is false"):
        off.validate()
    assert plan.with_attention_redistribution(False).validate().attention_redistribution is False


def test_a_move_off_its_tick_is_refused_by_the_simulator_and_the_runtime(plan):
    (group,) = plan.groups()
    moved = dataclasses.replace(group.attention_moves[0], tick=group.attention_moves[0].tick + 1)
    bad = dataclasses.replace(plan, phases=(dataclasses.replace(
        plan.phases[0], groups=(dataclasses.replace(group, attention_moves=(moved,)),)),))
    with pytest.raises(PlanError, match=r"attention_moves\[0\]: its heavy op .* does not start "
                                        r"at tick"):
        simulate(bad, model=MODEL, hardware=H100, cost=COST_H100)
    with pytest.raises(PlanError, match=r"attention_moves\[0\]: its heavy op"):
        check_runtime_plan(bad, MODEL)


def test_simulator_reads_the_moves_it_would_choose_bit_for_bit(plan):
    """The plan's moves priced by the simulator give the step, the stats and the memory the
    simulator gets choosing them itself (a format-3 plan) under the same cost model."""
    read = simulate(plan, model=MODEL, hardware=H100, cost=COST_H100).record
    chosen = simulate(_unchosen(plan), model=MODEL, hardware=H100, cost=COST_H100).record
    assert next(_unchosen(plan).groups()).attention_moves is None
    assert read.step_time_s == chosen.step_time_s
    assert read.extra["attention_redistribution"] == chosen.extra["attention_redistribution"]
    assert read.extra["attention_redistribution"]["pairs"] == 7
    assert read.peak_memory_bytes == chosen.peak_memory_bytes
    off = simulate(plan.with_attention_redistribution(False), model=MODEL, hardware=H100,
                   cost=COST_H100).record
    assert read.step_time_s < off.step_time_s


def test_a_plan_priced_on_h100_simulated_on_h800_prices_its_own_moves(plan):
    """Under H800 prices the simulator would keep other pairs (2, not 7); given the plan it
    prices the plan's 7 moves as they are."""
    (group,) = plan.groups()
    mine = simulate(plan, model=MODEL, hardware=H800, cost=COST_H800).record
    rechosen = simulate(_unchosen(plan), model=MODEL, hardware=H800, cost=COST_H800).record
    h800_moves = priced_moves(group, build_schedule(group), model=MODEL, cost=COST_H800,
                              gpus_per_node=8)
    assert len(h800_moves) == rechosen.extra["attention_redistribution"]["pairs"] == 2
    assert mine.extra["attention_redistribution"]["pairs"] == len(group.attention_moves) == 7
    assert mine.step_time_s != rechosen.step_time_s
    as_planned_on_h800 = dataclasses.replace(plan, phases=(dataclasses.replace(
        plan.phases[0], groups=(dataclasses.replace(group, attention_moves=h800_moves),)),))
    assert simulate(as_planned_on_h800, model=MODEL, hardware=H800,
                    cost=COST_H800).record.step_time_s == rechosen.step_time_s


def test_runtime_takes_the_plans_moves_and_refuses_a_format_3_plan_without_them(plan):
    rplan = check_runtime_plan(plan, MODEL)
    assert rplan.moves == {0: next(plan.groups()).attention_moves}
    with pytest.raises(ValueError, match=r"^group 0: attention_moves=None with "
                                         r"attention_redistribution at pp=4"):
        check_runtime_plan(_unchosen(plan), MODEL)


def test_move_is_plain_plan_data():
    m = Move(backward=True, tick=3, heavy_block=1, heavy_unit=2, light_block=0, light_unit=0,
             fraction=0.5)
    assert m.to_list() == [True, 3, 1, 2, 0, 0, 0.5]


@pytest.mark.parametrize("change", [
    {"light_unit": 10**6},  # no such unit
    {"light_block": 99},  # no such virtual stage
    "light of another move",
])
def test_a_light_op_off_its_tick_is_refused(plan, change):
    """Either side of a move is checked, each against the op's own tick."""
    (group,) = plan.groups()
    first, second = group.attention_moves[:2]
    if change == "light of another move":
        assert (first.backward, first.tick) != (second.backward, second.tick)
        change = {"light_block": second.light_block, "light_unit": second.light_unit}
    moved = dataclasses.replace(first, **change)
    bad_group = dataclasses.replace(group, attention_moves=(moved,))
    with pytest.raises(PlanError, match=r"attention_moves\[0\]: its light op \(block "
                                        rf"{moved.light_block}, unit {moved.light_unit}\) does "
                                        r"not start at tick"):
        check_move_ticks(bad_group, build_schedule(bad_group), bad_group.attention_moves)


def test_the_simulation_takes_the_groups_the_planner_priced_and_only_those():
    """``plan_method(priced=...)`` leaves each group whose moves it chose, priced; simulated
    under the same cost model, the plan's record is the one pricing it again gives (bit for
    bit), and the simulator does read it (a doctored entry changes the step). Under another
    cost model object, or for another group object, the entry is not taken."""
    priced = {}
    plan = plan_method("slimpipe", Batch.from_lengths([65536, 32768, 16384, 8192] * 2), MODEL,
                       H100, ParallelSpec(tp=4, pp=4, dp=1), COST_H100, num_slices=4,
                       attention_redistribution=True, priced=priced)
    (group,) = plan.groups()
    assert priced[group.group_id].group is group
    assert priced[group.group_id].cost is COST_H100
    fresh = simulate(plan, model=MODEL, hardware=H100, cost=COST_H100).record
    reused = simulate(plan, model=MODEL, hardware=H100, cost=COST_H100, priced=priced).record
    assert reused.step_time_s == fresh.step_time_s
    assert reused.unit_forward_s == fresh.unit_forward_s
    assert reused.unit_backward_s == fresh.unit_backward_s
    assert reused.extra["attention_redistribution"] == fresh.extra["attention_redistribution"]
    entry = priced[group.group_id]
    slower = dataclasses.replace(entry, costs=dataclasses.replace(
        entry.costs, fwd_s=[[2 * t for t in row] for row in entry.costs.fwd_s]))
    doctored = {group.group_id: slower}
    assert simulate(plan, model=MODEL, hardware=H100, cost=COST_H100,
                    priced=doctored).record.step_time_s > fresh.step_time_s
    other_cost = default_cost_model(MODEL, H100)
    assert simulate(plan, model=MODEL, hardware=H100, cost=other_cost,
                    priced=doctored).record.step_time_s == fresh.step_time_s
    copy = dataclasses.replace(plan, phases=(dataclasses.replace(
        plan.phases[0], groups=(dataclasses.replace(group),)),))
    assert simulate(copy, model=MODEL, hardware=H100, cost=COST_H100,
                    priced=doctored).record.step_time_s == fresh.step_time_s
