"""The harness's parts: point keys, the records store, verdict rules, registry, CLI, report."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from harness_selftest import REGISTRY, fixture_env

from repro.experiment import Check, Claim
from repro.registry import EXPERIMENTS, expand_names, resolve_experiment
from repro.report import render_report
from repro.runner import RunOptions, point_key, run_experiment
from repro.store import RecordStore

REPO = Path(__file__).resolve().parents[1]


# -- point keys --------------------------------------------------------------------------------
def test_point_key_is_stable_and_sensitive_to_every_part():
    base = point_key("e", {"a": 1, "b": [1, 2]})
    assert base == point_key("e", {"b": [1, 2], "a": 1})  # key order does not matter
    assert len(base) == 16
    assert base != point_key("f", {"a": 1, "b": [1, 2]})
    assert base != point_key("e", {"a": 1, "b": [2, 1]})
    assert base != point_key("e", {"a": 1.5, "b": [1, 2]})


# -- store ---------------------------------------------------------------------------------------
def block(key: str, n: int, **extra: object) -> list[dict]:
    return [{"experiment": "x", "point_key": key, "point_rows": n, "repro_version": "1",
             "backend": "sim", "value": i + 0.1, **extra} for i in range(n)]


def test_store_drops_partial_line_and_cut_block(tmp_path: Path):
    store = RecordStore(tmp_path / "records.csv")
    store.append_block(block("a", 2))
    store.append_block(block("b", 3))
    text = store.path.read_text()
    lines = text.splitlines(keepends=True)
    # Simulate a kill in the middle of b's block: one full row of three, then half a line.
    store.path.write_text("".join(lines[:4]) + lines[4][:7])
    assert RecordStore(store.path).done_keys() == {"a"}
    RecordStore(store.path).repair()
    assert store.path.read_text() == "".join(lines[:3])


def test_store_rewrites_header_for_new_columns_and_finalizes_canonically(tmp_path: Path):
    store = RecordStore(tmp_path / "records.csv")
    store.append_block(block("b", 1))
    store.append_block(block("a", 2, extra_col="z"))
    store.finalize(["a", "b"], "1")
    header, rows = store.read()
    assert header[:5] == ["experiment", "point_key", "point_rows", "repro_version", "backend"]
    assert header[5:] == sorted(header[5:])
    assert [r["point_key"] for r in rows] == ["a", "a", "b"]
    assert rows[2]["extra_col"] == ""
    assert float(rows[1]["value"]) == 1.1  # repr-exact floats


def test_finalize_drops_rows_of_an_older_harness_version(tmp_path: Path):
    store = RecordStore(tmp_path / "records.csv")
    store.append_block([{**r, "repro_version": "0"} for r in block("old", 1)])
    store.append_block(block("new", 1))
    store.finalize(["new"], "1")
    assert store.done_keys() == {"new"}


def test_append_block_refuses_an_empty_point(tmp_path: Path):
    with pytest.raises(ValueError, match="at least one row"):
        RecordStore(tmp_path / "r.csv").append_block([])


# -- verdict rules -------------------------------------------------------------------------------
def claim(value: float, check: Check) -> Claim:
    return Claim(claim_id="c", text="t", source="s", paper_value="p", reproduced=value, unit="",
                 check=check, hardware="h")


def test_verdicts_follow_the_rule_and_nan_is_no_data():
    within = Check(kind="within", target=124.0, rel_tol=0.15, reason="test")
    assert claim(140.0, within).verdict == "reproduced"  # 12.9% off
    assert claim(143.0, within).verdict == "not reproduced"  # 15.3% off
    assert claim(2.1, Check(kind="at_least", target=2.0, reason="test")).verdict == "reproduced"
    assert claim(1.9, Check(kind="at_least", target=2.0, reason="test")).verdict == "not reproduced"
    assert claim(0.9, Check(kind="at_most", target=1.0, reason="test")).verdict == "reproduced"
    assert claim(math.nan, within).verdict == "no data"


def test_check_rejects_bad_fields():
    with pytest.raises(ValueError, match="kind"):
        Check(kind="near", target=1.0, reason="test")
    with pytest.raises(ValueError, match="rel_tol"):
        Check(kind="within", target=1.0, rel_tol=-0.1, reason="test")


# -- registry and experiments ---------------------------------------------------------------------
def test_expand_names_and_unknown_names():
    assert expand_names(["all"]) == list(EXPERIMENTS)
    with pytest.raises(ValueError, match="unknown experiment"):
        expand_names(["no-such-figure"])


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_experiment_is_well_formed(name: str):
    exp = resolve_experiment(name)
    quick = exp.points(True)
    full = exp.points(False)
    assert quick and full
    # quick records must mean the same as full ones (they share one CSV): a subset.
    full_keys = {point_key(name, p) for p in full}
    assert {point_key(name, p) for p in quick} <= full_keys
    assert len(full_keys) == len(full)
    # Claims are listed, with paper values, even before anything has run.
    claims = exp.claims(pd.DataFrame())
    for c in claims:
        assert c.paper_value and c.source and c.verdict == "no data"


def test_every_listed_claim_of_the_issue_is_covered():
    ids = {(name, c.claim_id) for name in EXPERIMENTS
           for c in resolve_experiment(name).claims(pd.DataFrame())}
    for needed in [("e2e-throughput", "max-speedup"),
                   ("slimpipe-max-context", "max-context-1f1b"),
                   ("slimpipe-max-context", "max-context-interleaved-v2"),
                   ("slimpipe-max-context", "max-context-slimpipe-n16"),
                   ("slimpipe-mfu", "mfu-gain-512k-70b"), ("slimpipe-mfu", "mfu-2048k-70b"),
                   ("wlb-table2", "imbalance-2-queues"), ("flexsp-headline", "dp-bucketing-error"),
                   ("sim-fidelity", "memory-mape"), ("bubbles", "closed-form-exact")]:
        assert needed in ids


def test_max_context_numbers_against_slimpipe_paper(tmp_path: Path):
    """SlimPipe arXiv 2504.14519: 124K (1F1B), ~92K (interleaved), 600K (SlimPipe) on llama-7b
    tp8 pp8, 64x80GB. Our memory model gives 140K / 98K / 562K (within 15%)."""
    options = RunOptions(results_dir=tmp_path, progress=False, quick=True)
    assert run_experiment("slimpipe-max-context", options).ok
    from repro.analysis import load_records

    claims = {c.claim_id: c for c in resolve_experiment("slimpipe-max-context").claims(
        load_records(tmp_path, "slimpipe-max-context"))}
    assert claims["max-context-1f1b"].reproduced == 140
    assert claims["max-context-interleaved-v2"].reproduced == 98
    assert claims["max-context-slimpipe-n16"].reproduced == 562
    assert all(c.verdict == "reproduced" for c in claims.values())


def test_rerun_is_a_no_op_and_jobs_do_not_change_bytes(tmp_path: Path):
    one = RunOptions(results_dir=tmp_path / "one", progress=False, registry=REGISTRY)
    assert run_experiment("selftest-a", one).ran == 24
    again = run_experiment("selftest-a", one)
    assert (again.ran, again.already_done) == (0, 24)
    from repro.runner import make_pool, stop_pool

    two = RunOptions(results_dir=tmp_path / "two", progress=False, registry=REGISTRY,
                     jobs=2)
    pool = make_pool(2)
    try:
        run_experiment("selftest-a", two, pool)
    finally:
        stop_pool(pool, interrupted=False)
    path = Path("selftest-a") / "records.csv"
    assert (tmp_path / "one" / path).read_bytes() == (tmp_path / "two" / path).read_bytes()


def test_pool_queue_is_costliest_first_then_registry_then_sweep_order():
    from repro.runner import pool_order

    def pts(name: str, n: int) -> list[tuple[str, dict]]:
        return [(f"{name}{i}", {"i": i}) for i in range(n)]

    queue = pool_order([("b", pts("b", 3), [1.0, 5.0, 1.0], {"b0", "b1", "b2"}),
                        ("a", pts("a", 3), [1.0, 1.0, 9.0], {"a0", "a2"})],
                       registry_order=["a", "b"])
    # a2 (9) and b1 (5) first; the cost-1 ties in registry order (a before b), then sweep
    # order; a1 is already done and not queued.
    assert [key for _, key, _ in queue] == ["a2", "b1", "a0", "b0", "b2"]
    assert queue[0] == ("a", "a2", {"i": 2})


def test_the_long_paper_size_points_start_first():
    """With the shipped hints, `run all --jobs N` starts SlimPipe's paper-scale point first,
    and every 512-sample (134M/33.5M-token) point before any point of an experiment without
    a hint."""
    from repro.experiment import Experiment
    from repro.registry import experiment_names
    from repro.runner import point_costs, pool_order, sweep

    options = RunOptions(progress=False)
    sweeps = []
    for name in experiment_names():
        exp: Experiment = resolve_experiment(name)
        keyed = sweep(exp, options)
        sweeps.append((name, keyed, point_costs(exp, [c for _, c in keyed]), {k for k, _ in keyed}))
    queue = pool_order(sweeps, experiment_names())
    assert (queue[0][0], queue[0][2]["methods"]) == ("paper-scale", ["slimpipe"])
    hinted = {"paper-scale", "e2e-throughput", "batch-size"}

    def paper_size(name: str, config: dict) -> bool:
        return name in hinted and config["token_budget"] in (134217728, 33554432)

    big = [i for i, (name, _, config) in enumerate(queue) if paper_size(name, config)]
    # paper-scale 5 methods and the fixed layout, e2e 4 settings x 2 workloads, batch-size 1
    assert len(big) == 15
    assert max(big) < min(i for i, (name, _, _) in enumerate(queue) if name not in hinted)


def test_point_cost_hints_are_checked():
    from dataclasses import replace

    from repro.runner import point_costs

    exp = resolve_experiment("selftest-a", REGISTRY)
    assert point_costs(exp, [{"size": 4}]) == [1.0]  # no hint: every point costs 1
    hinted = replace(exp, point_cost=lambda p: p["size"])
    assert point_costs(hinted, [{"size": 4}, {"size": 0}]) == [4.0, 0.0]
    for bad in (-1.0, float("nan"), float("inf"), "3", True):
        with pytest.raises(ValueError, match="'selftest-a': point_cost must return a finite"):
            point_costs(replace(exp, point_cost=lambda p, b=bad: b), [{"size": 4}])


def test_report_lists_claims_and_marks_missing_runs(tmp_path: Path):
    text = render_report(tmp_path)
    assert ("| claim | source | paper value | reproduced value | rule | why this rule | verdict |"
            in text)
    assert "124K" in text and "no data" in text
    assert "_Not run yet: `python -m repro run e2e-throughput`._" in text


# -- CLI --------------------------------------------------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=REPO, env=fixture_env(),
                          capture_output=True, text=True, timeout=120)


def test_cli_unknown_experiment_is_a_usage_error(tmp_path: Path):
    done = cli("run", "no-such-figure", "--results-dir", str(tmp_path))
    assert done.returncode == 2
    assert "unknown experiment(s) 'no-such-figure'" in done.stderr


def test_cli_runtime_only_experiment_is_skipped_on_sim(tmp_path: Path):
    done = cli("run", "sim-fidelity", "--results-dir", str(tmp_path), "--wandb", "disabled")
    assert done.returncode == 0
    assert "skipped" in done.stderr and "runtime" in done.stderr


def test_wandb_failure_never_loses_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import repro.wandb_log as wl

    class Broken:
        def __getattr__(self, name: str):
            raise RuntimeError("no wandb today")

    monkeypatch.setitem(sys.modules, "wandb", Broken())
    warning = wl.log_to_wandb(mode="offline", results_dir=tmp_path, experiment="x",
                              job_type="run", config={})
    assert "failed, local results are intact" in warning and "no wandb today" in warning
    assert wl.log_to_wandb(mode="disabled", results_dir=tmp_path, experiment="x", job_type="run",
                           config={}) == ""


# -- fresh records against reference ones (repro compare, make reproduce) -----------------------
@pytest.fixture(scope="module")
def selftest_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ref = tmp_path_factory.mktemp("reference")
    for name in ("selftest-a", "selftest-b"):
        run_experiment(name, RunOptions(results_dir=ref, progress=False,
                                        registry=REGISTRY))
    return ref


def _repro(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro", *args, "--registry", REGISTRY],
                          cwd=REPO, env=fixture_env(), capture_output=True, text=True, timeout=120)


def _edit_csv(path: Path, edit) -> None:  # noqa: ANN001 - a callable on each row
    import csv

    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for i, row in enumerate(rows):
        edit(i, row)
    header = list(rows[0])
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def test_repro_compare_reports_drift_and_ignores_wall_clock(tmp_path: Path,
                                                            selftest_reference: Path):
    fresh = tmp_path / "fresh"
    shutil.copytree(selftest_reference, fresh)
    done = _repro("compare", "--results-dir", str(fresh), "--against", str(selftest_reference))
    assert done.returncode == 0, done.stderr
    assert "48 of 48 points identical (wall-clock columns aside)" in done.stdout

    # A wall-clock column that differs everywhere changes nothing.
    for directory, seconds in ((fresh, "1.5"), (selftest_reference, "9.0")):
        _edit_csv(directory / "selftest-a" / "records.csv",
                  lambda i, row, s=seconds: row.update(plan_seconds=s))
    done = _repro("compare", "--results-dir", str(fresh), "--against", str(selftest_reference))
    assert done.returncode == 0 and "48 of 48 points identical" in done.stdout

    # One value 1% off: reported with its column, fails at rtol 1e-3, passes at 2e-2.
    def nudge(i: int, row: dict) -> None:
        if i == 3:
            row["value"] = repr(float(row["value"]) * 1.01)

    _edit_csv(fresh / "selftest-b" / "records.csv", nudge)
    done = _repro("compare", "--results-dir", str(fresh), "--against", str(selftest_reference))
    assert done.returncode == 4
    assert "selftest-b: 23 of 24 points identical, max relative difference 0.0099" in done.stdout
    assert "largest: value" in done.stdout and "DRIFT beyond rtol 0.001" in done.stdout
    assert "47 of 48 points identical" in done.stdout
    done = _repro("compare", "--results-dir", str(fresh), "--against", str(selftest_reference),
                  "--rtol", "0.02")
    assert done.returncode == 0


def test_repro_compare_with_nothing_to_compare_fails(tmp_path: Path, selftest_reference: Path):
    done = _repro("compare", "--results-dir", str(tmp_path / "empty"), "--against",
                  str(selftest_reference))
    assert done.returncode == 4 and "nothing to compare" in done.stderr
    done = _repro("compare", "--results-dir", str(selftest_reference), "--against",
                  str(selftest_reference))
    assert done.returncode == 2 and "same directory" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_reproduce_recomputes_every_point_then_compares(tmp_path: Path,
                                                             selftest_reference: Path):
    fresh = tmp_path / "fresh"
    cmd = ["make", "-s", "-o", "install", "reproduce", f"PY={sys.executable}",
           f"REPRO_REGISTRY={REGISTRY}", f"REPRO_DIR={fresh}",
           f"REPRO_AGAINST={selftest_reference}", "JOBS=2",
           "REPRO_FLAGS=--no-progress --wandb disabled"]
    for attempt in range(2):
        done = subprocess.run(cmd, cwd=REPO, env=fixture_env(), capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        # Every point computed each time: the committed (here: reference) records and a
        # previous complete run are never reused.
        assert "selftest-a: 24 run, 0 already done" in done.stderr
        assert "48 of 48 points identical (wall-clock columns aside)" in done.stdout
        assert (fresh / "REPORT.md").exists() and (fresh / ".complete").exists()
        assert ("starting afresh" in done.stdout) == (attempt == 1)
    # No .complete marker (an interrupted run): the next `make reproduce` resumes instead.
    (fresh / ".complete").unlink()
    done = subprocess.run(cmd, cwd=REPO, env=fixture_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "selftest-a: 0 run, 24 already done" in done.stderr


def test_harness_self_test_fixtures_are_not_shipped_in_repro():
    import importlib.util

    for module in ("repro.selftest", "repro.selftest_b"):
        assert importlib.util.find_spec(module) is None, module
    assert resolve_experiment("selftest-b", REGISTRY).name == "selftest-b"


def test_finalize_keeps_an_all_empty_runtime_refusal_column(tmp_path):
    """Empty columns are dropped, except ``runtime_refusal``: empty everywhere means every plan
    runs, which the report must not read as "records from before the check"."""
    from repro.store import RecordStore

    store = RecordStore(tmp_path / "records.csv")
    store.append_block([{"experiment": "x", "point_key": "p", "point_rows": 1,
                         "repro_version": "v", "backend": "sim", "method": "m",
                         "runtime_refusal": "", "note": ""}])
    store.finalize(["p"], "v")
    header, rows = RecordStore(tmp_path / "records.csv").read()
    assert "runtime_refusal" in header and "note" not in header
    assert rows[0]["runtime_refusal"] == ""


def test_a_failed_methods_row_keeps_the_points_setting(monkeypatch: pytest.MonkeyPatch):
    # A method that failed to plan has a record without model, GPUs... (None): its row keeps
    # the point's, while a row's own value (the layout it ran) still wins over the point's.
    import repro.runner as runner
    from repro.experiment import Experiment

    point = {"model": "llama-7b", "num_gpus": 64, "parallel": {"tp": 8, "pp": 2}}
    rows = [{"method": "ok", "model": "llama-7b", "num_gpus": 64, "parallel": '{"tp": 8}'},
            {"method": "failed", "model": None, "num_gpus": None, "error": "refused"}]
    experiment = Experiment(name="x", description="", points=lambda quick: [point],
                            run_point=lambda p: [dict(r) for r in rows])
    monkeypatch.setattr(runner, "resolve_experiment", lambda name, registry: experiment)
    _, out = runner.compute_point("any", "x", "k", {**point, "backend": "sim"})
    assert [(r["model"], r["num_gpus"]) for r in out] == [("llama-7b", 64)] * 2
    assert out[0]["parallel"] == '{"tp": 8}' and json.loads(out[1]["parallel"]) == {"pp": 2, "tp": 8}
    assert out[1]["error"] == "refused"
