"""Adding a method is one file plus one registry entry (issue 24).

The "one file" is the block below (a throwaway method: naive's first-fit-decreasing packer
under another name, reached through its public planner, with its own options dataclass) and
the "one entry" is ``DEFAULT_METHODS.with_methods(METHOD)``. Nothing else in the suite is
edited: the CLI, ``slimpack.compare``, a harness experiment run by the real runner, the
figures' order and the report all take the method from the registry value they are given,
and the suite's own registry stays without it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from types import MappingProxyType

import pytest

from baselines import naive
from repro.experiments import e2e_throughput
from repro.experiments.common import over_methods
from slimpack.batch import Batch
from slimpack.methods import DEFAULT_METHODS, MethodRegistry
from slimpack.plan import Plan
from slimpack.planning.method import MethodSpec
from slimpack.planning.setup import PlanSetup
from slimpack.specs import ParallelSpec

# -- the throwaway method's "one file" ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ThrowawayOptions:
    context: int | None = None
    time_limit_s: float | None = None
    recompute: str = "auto"


def plan(batch: Batch, setup: PlanSetup, options: ThrowawayOptions) -> Plan:
    packed = naive.plan(batch, setup, naive.NaiveOptions(
        packing="ffd", context=options.context, recompute=options.recompute, time_limit_s=None))
    return dataclasses.replace(packed, method="throwaway")


METHOD = MethodSpec(name="throwaway", planner=plan, options=ThrowawayOptions,
                    summary="first-fit-decreasing packing under another name (a test's method)",
                    source="tests/test_registry_throwaway_method.py")

# -- its "one registry entry" ------------------------------------------------------------------

REGISTRY = DEFAULT_METHODS.with_methods(METHOD)

# This module is also a harness registry (``RunOptions(registry=...)``): the real
# e2e-throughput experiment over REGISTRY's methods, run by the real runner below.
EXPERIMENTS = MappingProxyType({"e2e-throughput": __name__})
EXPERIMENT = over_methods(e2e_throughput.EXPERIMENT, REGISTRY)
# -----------------------------------------------------------------------------------------------

MODEL, HARDWARE = "llama-7b", "h100"


def _workload():
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.data import sample_batch
    from slimpack.specs import hardware_preset, model_preset

    model, hardware = model_preset(MODEL), hardware_preset(HARDWARE)
    batch = sample_batch("wikipedia", num_sequences=32, context=8192, seed=0)
    return batch, model, hardware, default_cost_model(model, hardware)


def test_the_registry_is_a_value_and_the_suites_stays_as_it_was():
    assert REGISTRY.names() == [*DEFAULT_METHODS.names(), "throwaway"]
    assert REGISTRY.compared_names() == [*DEFAULT_METHODS.compared_names(), "throwaway"]
    assert "throwaway" not in DEFAULT_METHODS.names()
    assert REGISTRY.get("throwaway") is METHOD
    with pytest.raises(ValueError, match="registered twice.*throwaway"):
        REGISTRY.with_methods(METHOD)
    with pytest.raises(ValueError, match="unknown method 'throwaway'"):
        DEFAULT_METHODS.get("throwaway")
    with pytest.raises(ValueError, match="spec 'throwaway' registered as 'other'"):
        MethodRegistry(entries=(("other", METHOD),))


def test_cli_lists_plans_and_compares_it(tmp_path, capsys):
    from slimpack.cli.main import main

    assert main(["methods"], registry=REGISTRY) == 0
    listed = capsys.readouterr().out
    assert "throwaway" in listed and "first-fit-decreasing packing" in listed
    assert main(["methods", "throwaway"], registry=REGISTRY) == 0
    assert "recompute" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # the suite's CLI does not know it
        main(["methods", "throwaway"])
    capsys.readouterr()

    out = tmp_path / "plan.json"
    workload = ["--model", MODEL, "--hardware", HARDWARE, "--gpus", "4", "--dataset",
                "wikipedia", "--context", "8192", "--global-batch", "32"]
    assert main(["plan", "--method", "throwaway", *workload, "--tp", "2", "--pp", "2",
                 "-o", str(out), "--json"], registry=REGISTRY) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "throwaway" and summary["parallel"]["dp"] == 1
    assert main(["simulate", str(out), "--model", MODEL, "--hardware", HARDWARE,
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["method"] == "throwaway" and record["step_time_s"] > 0

    # Two jobs: the registry (and the method in it) travels to the worker processes.
    assert main(["compare", "--methods", "naive,throwaway", *workload, "--tp", "2",
                 "--option", "naive:packing=ffd", "--jobs", "2", "--json"],
                registry=REGISTRY) == 0
    rows = json.loads(capsys.readouterr().out)["records"]
    assert [r["method"] for r in rows] == ["naive", "throwaway"]
    # The same packer under another name: the same step, to the bit.
    assert rows[1]["step_time_s"] == rows[0]["step_time_s"] > 0


def test_compare_gives_it_a_row_at_a_fixed_layout_and_under_the_search():
    from slimpack.compare import compare

    batch, model, hardware, _ = _workload()
    fixed = [r.to_dict() for r in compare(
        ["megatron", "throwaway"], batch, model, hardware, 8,
        parallel=ParallelSpec(tp=2, pp=2, dp=2), context=8192, registry=REGISTRY)]
    assert [r["method"] for r in fixed] == ["megatron", "throwaway"]
    assert not fixed[1]["error"] and fixed[1]["step_time_s"] > 0
    assert {k: fixed[1]["parallel"][k] for k in ("tp", "cp", "pp", "dp")} == {
        "tp": 2, "cp": 1, "pp": 2, "dp": 2}
    searched = compare(["megatron", "throwaway"], batch, model, hardware, 8,
                       auto_parallel=True, context=8192, registry=REGISTRY,
                       auto_parallel_top_k={"megatron": 2, "throwaway": 2})
    mine = searched[1].to_dict()
    assert mine["method"] == "throwaway" and not mine["error"]
    assert mine["layouts_simulated"] == 2 and mine["layouts_candidates"] > 2
    # Under the suite's registry the name is unknown: an error row, never a silent gap.
    default = compare(["throwaway"], batch, model, hardware, 8,
                      parallel=ParallelSpec(tp=2, pp=2, dp=2), context=8192)
    assert "unknown method 'throwaway'" in default[0].error and default[0].step is None


def test_a_harness_experiment_runs_plots_and_reports_it(tmp_path):
    from repro.analysis import load_records
    from repro.diagnosis import report_lines
    from repro.experiments import batch_size
    from repro.figures import method_order
    from repro.report import render_report
    from repro.runner import RunOptions, run_experiment

    with pytest.raises(ValueError, match="'batch-size' takes no method registry"):
        over_methods(batch_size.EXPERIMENT, REGISTRY)  # a named subset of methods, on purpose
    point = EXPERIMENT.points(True)[0]
    assert point["methods"] == [*e2e_throughput.EXPERIMENT.points(True)[0]["methods"],
                                "throwaway"]
    # e2e-throughput searches every baseline of a SlimPack ratio exhaustively, the new one too
    # (a method's search is exhaustive unless its spec caps it).
    assert METHOD.search_layouts is None and point["search_top_k"]["throwaway"] is None

    summary = run_experiment("e2e-throughput", RunOptions(
        results_dir=tmp_path, quick=True, progress=False, registry=__name__))
    assert summary.ok and summary.ran == 1
    records = load_records(tmp_path, "e2e-throughput")
    mine = records[records["method"] == "throwaway"]
    assert sorted(mine["protocol"]) == ["best layout", "fixed layout"]
    if "error" in mine.columns:  # the store keeps a column only where some row has a value
        assert (mine["error"].fillna("") == "").all()
    assert (mine["tokens_per_s"] > 0).all()
    best = mine[mine["protocol"] == "best layout"].iloc[0]
    # Exhaustive: every candidate simulated or pruned by the bound, none from the winners.
    assert best["search_exhaustive"] and best["layouts_from_winners"] == 0
    assert best["layouts_simulated"] + best["layouts_pruned"] == best["layouts_candidates"]

    # One more method changes no other method's record (a clone of naive brings no layout
    # that naive did not already bring to the winner-layout pass).
    alone = e2e_throughput.run_point(e2e_throughput.EXPERIMENT.points(True)[0])
    others = records[records["method"] != "throwaway"]
    assert len(alone) == len(others)
    for row, (_, rec) in zip(alone, others.iterrows(), strict=True):
        assert (row["method"], row["protocol"]) == (rec["method"], rec["protocol"])
        assert row["step_time_s"] == pytest.approx(rec["step_time_s"], rel=1e-12)

    # The figures' order: the registry's order, then names it does not hold.
    present = [*records["method"].unique(), "aaa-variant"]
    assert method_order(present, REGISTRY)[-2:] == ["throwaway", "aaa-variant"]
    assert method_order(present)[-2:] == ["aaa-variant", "throwaway"]
    figures = EXPERIMENT.plot(records, tmp_path / "figures")
    assert [f.name for f in figures] == ["throughput.png"] and figures[0].stat().st_size > 0

    claims = {c.claim_id: c for c in EXPERIMENT.claims(records)}
    assert 0.0 <= claims["slimpack-wins"].reproduced <= 1.0  # judged over both protocols
    report = render_report(tmp_path, registry=__name__, method_registry=REGISTRY)
    assert "## e2e-throughput" in report
    assert re.search(r"\*\*e2e-throughput\*\*: SlimPack fastest in [0-2] of 2 settings", report)

    # The report's loss lines judge the registry's methods: a throwaway that wins is named
    # under REGISTRY and left out (as a variant would be) under the suite's registry.
    faster = records.copy()
    faster.loc[faster["method"] == "throwaway", "tokens_per_s"] *= 10

    def records_of(name):
        return faster if name == "e2e-throughput" else load_records(tmp_path, name)

    assert any("throwaway" in line for line in report_lines(records_of, REGISTRY))
    assert not any("throwaway" in line for line in report_lines(records_of))
