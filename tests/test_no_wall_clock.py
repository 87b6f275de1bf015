"""Records never depend on wall-clock time (issue 24): the harness plans every method with no
wall-clock safety net, and ``slimpack compare --auto-parallel`` chooses layouts by counts
only. Checked by running the same workload under a clock that jumps 1000 s on every read: a
limit anywhere in the path would expire and change the plan."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from repro.experiments.common import (
    HARNESS_METHOD_OPTIONS,
    TIMING_COLUMNS,
    compare_rows,
    with_harness_options,
)
from slimpack.batch import Batch
from slimpack.compare import compare
from slimpack.methods import get_method, method_names
from slimpack.specs import hardware_preset, model_preset

POINT = {"model": "llama-7b", "hardware": "h100-80g", "num_gpus": 16,
         "parallel": {"tp": 4, "pp": 2}, "context": 32768, "dataset": "commoncrawl",
         "global_batch": 48, "seed": 3}
CLOCKED = ("wlb-llm", "flexsp", "slimpipe", "slimpack")
"""Planners with a search that a wall-clock limit could cut."""


def _jumping_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = itertools.count(1)
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + 1000.0 * next(ticks))
    monkeypatch.setattr(time, "monotonic", lambda: real() + 1000.0 * next(ticks))


def _stable(rows: list[dict]) -> str:
    drop = set(TIMING_COLUMNS) | {"search"}  # "search" prints seconds for people
    return json.dumps([{k: _without_wall(_cell(v)) for k, v in r.items()
                        if k not in drop and "wall" not in k} for r in rows],
                      sort_keys=True, default=str)


def _cell(value):
    """A JSON-text cell (a record's ``extra``) as its object, other values as they are."""
    if isinstance(value, str) and value.startswith("{"):
        return json.loads(value)
    return value


def _without_wall(value):
    """``value`` without the keys that time the machine (the simulator's ``sim_wall_s``)."""
    if isinstance(value, dict):
        return {k: _without_wall(v) for k, v in value.items() if "wall" not in k}
    return value


def test_every_method_plans_in_the_harness_without_a_wall_clock_limit():
    options = with_harness_options(tuple(method_names()), None)
    for name in method_names():
        assert options[name]["time_limit_s"] is None
        get_method(name).make_options(options[name])  # every planner accepts "no limit"
    assert HARNESS_METHOD_OPTIONS == {"time_limit_s": None}
    with pytest.raises(ValueError, match="time_limit_s must be None"):
        with_harness_options(("slimpack",), {"slimpack": {"time_limit_s": 30.0}})


def test_harness_records_are_the_same_under_a_clock_that_jumps(monkeypatch):
    steady = compare_rows(POINT, CLOCKED, "test")
    assert all(not r["error"] and not r["fallback"] for r in steady), steady
    _jumping_clock(monkeypatch)
    jumped = compare_rows(POINT, CLOCKED, "test")
    assert _stable(jumped) == _stable(steady)


def test_default_wall_clock_limits_do_mark_a_clock_cut_plan_as_a_fallback(monkeypatch):
    """The CLI's safety nets still exist; reached, the plan says it is machine-dependent."""
    from slimpack.compare import plan_method
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.specs import ParallelSpec

    model, hw = model_preset("llama-7b"), hardware_preset("h100-80g")
    batch = Batch.from_lengths([30000, 20000, 9000, 7000, 5000, 3000, 1000, 800] * 4)
    cost = default_cost_model(model, hw)
    _jumping_clock(monkeypatch)
    plan = plan_method("flexsp", batch, model, hw, ParallelSpec(tp=4, dp=4), cost,
                       context=32768, time_limit_s=5.0)
    assert "wall-clock safety net reached" in plan.metadata["fallback"]


def test_compare_auto_parallel_chooses_the_same_layouts_under_a_jumping_clock(monkeypatch):
    """``slimpack compare --auto-parallel``'s library call with its defaults: no wall-clock
    search budget, so a slow machine simulates the same layouts as a fast one."""
    model, hw = model_preset("llama-7b"), hardware_preset("h100-80g")
    batch = Batch.from_lengths([30000, 20000, 9000, 7000, 5000, 3000, 1000, 800] * 3)
    methods = ["megatron", "wlb-llm"]
    options = with_harness_options(tuple(methods), None)
    steady = [r.to_dict() for r in compare(methods, batch, model, hw, 16, auto_parallel=True,
                                           context=32768, method_options=options)]
    _jumping_clock(monkeypatch)
    jumped = [r.to_dict() for r in compare(methods, batch, model, hw, 16, auto_parallel=True,
                                           context=32768, method_options=options)]
    assert _stable(jumped) == _stable(steady)
    assert all(r["search_exhaustive"] for r in jumped)
