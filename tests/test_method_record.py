"""One record type for every method row (issue 24): ``slimpack compare``, the all-method
experiments' searches and the fixed-layout ablation all emit ``MethodRecord`` rows with the one
column set, and the same method on the same layout gives the same numbers on every path."""

from __future__ import annotations

import json
import math

import pytest

from repro.experiments.common import best_record_rows, compare_rows, simulate_planner
from slimpack.records import METHOD_RECORD_COLUMNS, MethodRecord, check_method_row

FIXED = {"model": "llama-7b", "dataset": "wikipedia", "context": 16384, "num_gpus": 16,
         "global_batch": 48, "seed": 3, "hardware": "h800-80g", "parallel": {"tp": 4, "pp": 2}}
SEARCHED = {k: v for k, v in FIXED.items() if k != "parallel"}
METHODS = ("megatron", "slimpack")


def test_every_path_emits_the_one_schema_with_the_same_numbers():
    fixed = compare_rows(FIXED, METHODS, "test")
    searched = best_record_rows(SEARCHED, METHODS, "test", top_k=1)
    # The ablation's path takes the planner's own context unless given one: given the point's.
    alone = [simulate_planner(FIXED, method, "test", context=FIXED["context"])
             for method in METHODS]
    for row in [*fixed, *searched, *alone]:
        assert list(row) == list(METHOD_RECORD_COLUMNS), row["method"]
        assert not row["error"] and row["step_time_s"] > 0, row["error"]
        assert all(not isinstance(v, list | dict) for v in row.values())  # one CSV cell each
    for a, b in zip(fixed, alone, strict=True):  # compare's fixed layout is the ablation's path
        assert a["method"] == b["method"]
        for column in ("step_time_s", "mfu", "peak_memory_bytes", "unit_forward_s", "oom",
                       "recompute", "zero_stage", "parallel", "search"):
            assert a[column] == b[column], (a["method"], column)
    assert [r["search"] for r in fixed] == ["fixed layout"] * 2
    assert all(r["layouts_simulated"] >= 1 for r in searched)
    assert json.loads(fixed[0]["parallel"])["tp"] == 4


def test_a_failed_method_has_the_schema_and_no_numbers():
    record = MethodRecord(method="broken", step=None, parallel=None, error="ValueError: no")
    row = record.to_row()
    assert list(row) == list(METHOD_RECORD_COLUMNS)
    assert row["oom"] is None  # no memory verdict, never "fits"
    assert row["step_time_s"] is None and math.isnan(record.step_time_s)
    with pytest.raises(ValueError, match="a step or an error"):
        MethodRecord(method="broken", step=None, parallel=None)


def test_a_row_lacking_schema_columns_is_refused_by_name():
    row = MethodRecord(method="broken", step=None, parallel=None, error="x").to_row()
    del row["zero_stage"], row["mfu"]
    with pytest.raises(ValueError, match=r"'broken'.*\['mfu', 'zero_stage'\]"):
        check_method_row(row)


def test_records_say_whether_the_runtime_executes_the_plan():
    # The same batch on one layout: Megatron-LM's plan runs, and so does SlimPipe's, which
    # states SlimPipe's attention redistribution between pipeline ranks (executed lane by
    # lane at tp2). A refused plan's row names the field (next test).
    point = {**FIXED, "parallel": {"tp": 2, "pp": 4}}
    rows = {r["method"]: r for r in compare_rows(point, ("megatron", "slimpipe"), "test")}
    assert rows["megatron"]["runtime_refusal"] == ""
    assert rows["slimpipe"]["runtime_refusal"] == ""


def test_runtime_refusal_names_the_field_for_a_model_it_does_not_run():
    from dataclasses import replace

    from slimpack.runtime.examples import packed_plan
    from slimpack.runtime.validate import runtime_refusal
    from slimpack.specs import model_preset

    plan = packed_plan(pp=1, dp=1)
    tiny = model_preset("tiny")
    assert runtime_refusal(plan, tiny) == ""
    assert "num_experts" in runtime_refusal(plan, replace(tiny, num_experts=4, moe_top_k=2))
