"""The ablation's spread: per-batch component gains, Student-t intervals, claims that can fail."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from repro.analysis import mean_ci95
from repro.experiments import ablation


def test_mean_ci95_uses_student_t():
    # [1, 2, 3]: mean 2, sample sd 1, t(0.975, 2) = 4.303 (any t table): half-width 4.303/sqrt(3).
    mean, low, high = mean_ci95([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert high - mean == pytest.approx(4.303 / math.sqrt(3), rel=1e-12)
    assert mean - low == pytest.approx(high - mean, rel=1e-12)
    one = mean_ci95([1.5])
    assert one[0] == 1.5 and math.isnan(one[1]) and math.isnan(one[2])


def test_gains_are_same_batch_ratios_and_claims_use_the_interval_low_end():
    point = ablation.points(quick=True)[0]
    records = pd.DataFrame([dict(row, point_key="p0", dataset=point["dataset"],
                                 seed=point["seed"]) for row in ablation.run_point(point)])
    frame = ablation.gains(records)
    per = records.set_index("variant")["tokens_per_s"]
    asym = frame[frame["component"] == "asymmetric"]["gain"].item()
    assert asym == pytest.approx(per["+asymmetric"] / per["slicing"], rel=1e-12)
    assert set(frame["component"]) == {"asymmetric", "dp-aware", "dp-merge",
                                       "all (slimpack / slicing)"}
    # One batch: no interval can be claimed, so every component claim has no data.
    claims = {c.claim_id: c for c in ablation.claims(records)}
    assert claims["gain-asymmetric"].verdict == "no data"
    # Two batches whose asymmetric gains straddle 1 cannot reproduce "each component helps".
    second = records.assign(point_key="p1", seed=point["seed"] + 1)
    second.loc[second["variant"] == "+asymmetric", "tokens_per_s"] = \
        1.02 * per["slicing"]
    second.loc[second["variant"] == "slicing", "tokens_per_s"] = per["slicing"]
    both = pd.concat([records, second], ignore_index=True)
    both.loc[(both["point_key"] == "p0") & (both["variant"] == "+asymmetric"),
             "tokens_per_s"] = 0.98 * per["slicing"]
    claim = {c.claim_id: c for c in ablation.claims(both)}["gain-asymmetric"]
    assert claim.reproduced < 1.0 and claim.verdict == "not reproduced"
    (title, table), = ablation.gain_table(both)
    assert "95%" in title and set(table["batches"]) == {2}
