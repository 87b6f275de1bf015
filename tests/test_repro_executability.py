"""REPORT.md's "Which plans the runtime executes" section, from records' runtime_refusal."""

from __future__ import annotations

import pandas as pd

from repro.executability import executability, report_lines
from slimpack.runtime.validate import refused_field


def test_refused_field_is_the_field_the_runtime_names():
    assert refused_field("group 0: vocab_parallel_pp=True is not executed by the runtime; "
                         "allowed: false when pp > 1") == "vocab_parallel_pp"
    assert refused_field("plan: attention_redistribution=True is not executed") == \
        "attention_redistribution"


def test_counts_executed_and_refused_plans_per_method_and_skips_failures():
    frame = pd.DataFrame([
        {"method": "megatron", "error": "", "runtime_refusal": ""},
        {"method": "megatron", "error": "", "runtime_refusal": float("nan")},  # CSV's empty cell
        {"method": "slimpipe", "error": "", "runtime_refusal": "plan: attention_redistribution=True x"},
        {"method": "slimpipe", "error": "", "runtime_refusal": ""},
        {"method": "slimpipe", "error": "ValueError: no layout", "runtime_refusal": ""},
    ])
    table = executability({"e2e-throughput": frame}).set_index("method")
    assert table.loc["megatron", "records"] == 2 and table.loc["megatron", "executed"] == 2
    assert table.loc["slimpipe", "records"] == 2 and table.loc["slimpipe", "executed"] == 1
    assert table.loc["slimpipe", "refused fields"] == "attention_redistribution (1)"


def test_section_lists_methods_in_the_given_order_and_old_records_apart():
    frames = {"e2e-throughput": pd.DataFrame([
        {"method": "slimpack", "error": "", "runtime_refusal": ""},
        {"method": "megatron", "error": "", "runtime_refusal": ""}]),
        "balance": pd.DataFrame([{"method": "naive", "error": ""}])}  # before the column
    lines = report_lines(lambda name: frames.get(name, pd.DataFrame()),
                         lambda present: sorted(present, key=["megatron", "slimpack",
                                                              "naive"].index))
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert rows == ["| megatron | 1 | 1 (100%) | - |", "| slimpack | 1 | 1 (100%) | - |"]
    assert any("naive 1" in line for line in lines)
