"""The e2e-throughput report's table of the layouts each method's search covered (issue 24:
every method's layouts searched, in the report as in the records)."""

from __future__ import annotations

import json

import pandas as pd

from repro.experiments.e2e_throughput import SAMPLE_PIECES, search_table

SPACE = "tp<=gpus/node cp<=32 pp<=32 vpp in {1,2,3,4,5}"


def _row(method: str, simulated: int, exhaustive: bool, *, workload: str = "documents",
         budget: int = 512 * 65536, protocol: str = "best layout", gain: float = 0.0) -> dict:
    return {"method": method, "search_gain_bound": 0.0 if exhaustive else gain,
            "token_budget": budget, "protocol": protocol,
            "workload": workload, "search_space": SPACE, "search_exhaustive": exhaustive,
            "layouts_candidates": 150, "layouts_simulated": simulated, "layouts_pruned": 0,
            "layouts_from_winners": 1 if method == "slimpack" else 0,
            "search_top_k": json.dumps({"megatron": None, "slimpack": 3})}


def test_the_table_spans_both_workloads_of_the_largest_batch_and_names_each_budget():
    frame = pd.DataFrame([
        _row("megatron", 90, True), _row("megatron", 95, True, workload=SAMPLE_PIECES),
        _row("slimpack", 3, False, gain=0.012),
        _row("slimpack", 4, False, workload=SAMPLE_PIECES, gain=0.0345),
        _row("slimpack", 99, True, budget=16 * 65536),  # the smoke batch: not read
        _row("slimpack", 99, True, protocol="fixed layout"),  # not a search
    ])
    [(title, table)] = search_table(frame)
    assert "best-layout protocol" in title
    rows = table.set_index("method")
    assert list(rows.index) == ["megatron", "slimpack"]
    assert rows.loc["megatron", "simulated"] == "90-95"
    assert rows.loc["megatron", "budget"] == "every layout the bound keeps"
    assert rows.loc["megatron", "exhaustive"] == "2 of 2"
    assert rows.loc["slimpack", "simulated"] == "3-4"
    assert rows.loc["slimpack", "budget"] == "3 best-estimated, then the winners' layouts"
    assert rows.loc["slimpack", "exhaustive"] == "0 of 2"
    assert rows.loc["slimpack", "search space"] == SPACE
    # The largest gain any setting's unsimulated layouts could give, in percent.
    assert rows.loc["megatron", "most an unsimulated layout could gain"] == "0.0%"
    assert rows.loc["slimpack", "most an unsimulated layout could gain"] == "3.5%"


def test_records_without_search_columns_give_no_table():
    assert search_table(pd.DataFrame([{"method": "megatron", "token_budget": 1}])) == []
