"""The batch-size experiment: paper-size points in samples, and a claim that fails when
Megatron-LM wins at any batch size."""

from __future__ import annotations

import json

import pandas as pd

from repro.experiments import batch_size


def _rows(samples, speedup, pp):
    layout = json.dumps({"tp": 2, "cp": 4, "pp": pp, "dp": 8, "vpp": 1})
    return [{"samples": samples, "seed": 0, "method": "megatron", "tokens_per_s": 100.0,
             "bubble_fraction": 0.25, "parallel": layout},
            {"samples": samples, "seed": 0, "method": "megatron-causal", "tokens_per_s": 50.0,
             "bubble_fraction": 0.0, "parallel": layout},
            {"samples": samples, "seed": 0, "method": "slimpack", "tokens_per_s": 100.0 * speedup,
             "bubble_fraction": 0.1, "parallel": layout}]


def test_points_are_counted_in_context_length_samples():
    for point in batch_size.points(False):
        assert point["token_budget"] == point["samples"] * batch_size.CONTEXT
    assert max(p["samples"] for p in batch_size.points(False)) == 512


def test_a_batch_where_megatron_wins_fails_the_claim():
    wins = pd.DataFrame(_rows(8, 1.2, 2) + _rows(512, 1.05, 4))
    (claim,) = batch_size.claims(wins)
    assert claim.reproduced == 1.05 and claim.verdict == "reproduced"
    assert claim.bracket[1] == ("megatron-causal", 2.1)
    assert "8 samples: SlimPack 1.20x, Megatron-LM at tp2 cp4 pp2 dp8 with a 25% bubble" in \
        claim.analysis
    loses = pd.DataFrame(_rows(8, 0.8, 1) + _rows(512, 1.05, 4))
    (claim,) = batch_size.claims(loses)
    assert claim.reproduced == 0.8 and claim.verdict == "not reproduced"
