"""Every registered planner under random batches and layouts (the 10^4-case run is
``python -m slimpack.validation.planner_fuzz --cases 10000``)."""

from __future__ import annotations

from slimpack.validation.planner_fuzz import run


def test_random_cases_through_every_planner_agree_with_the_simulator():
    # Valid plans holding every token, memory verdicts equal to the simulator's, time limits
    # held (0.5 s of grace for a shared CI machine), fallbacks only with a reason.
    result = run(120, seed=7, grace_s=0.5)
    assert result.failures == []
    assert result.cases >= 60
    assert len(result.per_method) >= 8
