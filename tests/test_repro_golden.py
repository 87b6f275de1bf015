"""Regression: the quick sweeps of cheap experiments reproduce the committed golden headlines.

Golden files (``results/golden/<hardware>.json``) are written by ``python -m repro golden
--update``; a headline that moves by more than its tolerance fails here, naming the number.
"""

from __future__ import annotations

import json

from repro.golden import GOLDEN_EXPERIMENTS, compute_headlines, read_golden, regressions


def test_quick_sweep_matches_golden_headlines():
    golden = read_golden()
    assert golden, "no results/golden/*.json: run `python -m repro golden --update`"
    current = compute_headlines(GOLDEN_EXPERIMENTS)
    assert regressions(current, golden) == []


def test_regressions_name_the_moved_number():
    golden = {"h100-80g": {"x/y": {"value": 100.0, "rel_tol": 0.02}}}
    assert regressions({"h100-80g": {"x/y": {"value": 101.0, "rel_tol": 0.02}}}, golden) == []
    moved = regressions({"h100-80g": {"x/y": {"value": 103.0, "rel_tol": 0.02}}}, golden)
    assert moved and "x/y" in moved[0] and "103" in moved[0]
    assert "missing" in regressions({}, golden)[0]
    json.dumps(golden)  # golden files are plain JSON


def test_nothing_to_compare_is_a_failure_not_ok(tmp_path):
    current = {"h800-80g": {"e2e-throughput/max-speedup": {"value": 1.69, "rel_tol": 0.02}}}
    assert read_golden(tmp_path / "missing") == {}
    (problem,) = regressions(current, read_golden(tmp_path / "missing"))
    assert "no golden headlines" in problem and "golden --update" in problem
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "h800-80g.json").write_text("{}\n")
    assert regressions(current, read_golden(tmp_path)) == [problem]


def test_cli_check_exits_non_zero_on_an_empty_results_dir(tmp_path, monkeypatch, capsys):
    """The real CLI path; only the 35-second quick sweeps are replaced by their result."""
    import repro.golden
    from repro.__main__ import main

    monkeypatch.setattr(repro.golden, "compute_headlines", lambda **kw: {
        "h800-80g": {"e2e-throughput/max-speedup": {"value": 1.69, "rel_tol": 0.02}}})
    assert main(["golden", "--check", "--results-dir", str(tmp_path / "empty")]) != 0
    err = capsys.readouterr().err
    assert "no golden headlines" in err and "golden: ok" not in err


def test_golden_pins_slimpack_and_slimpipe_headlines():
    golden = read_golden()
    keys = set(golden.get("h800-80g", {}))
    assert {"e2e-throughput/max-speedup", "e2e-throughput/max-speedup vs megatron-causal",
            "slimpipe-mfu/mfu-gain-512k-70b", "slimpipe-mfu/mfu-2048k-70b"} <= keys
