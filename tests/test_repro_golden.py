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
