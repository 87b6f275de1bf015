"""Claims that can fail: Megatron brackets, rules with stated tolerances, consistency checks."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from repro.experiment import Check, Claim
from repro.experiments import e2e_throughput, outliers, scalability
from repro.experiments.common import ALL_METHODS


def _rows(point: int, **tps: float) -> list[dict]:
    keys = {"model": "llama-70b", "dataset": "commoncrawl", "context": 256 * 1024,
            "num_gpus": 128, "global_batch": 512, "seed": point, "point_key": f"p{point}"}
    return [{**keys, "method": m, "tokens_per_s": v} for m, v in tps.items()]


# -- Megatron-LM in both attention semantics, everywhere SlimPack is compared with it ----------
def test_megatron_causal_runs_in_every_end_to_end_experiment():
    assert "megatron-causal" in ALL_METHODS
    for point in e2e_throughput.points(True):
        assert "megatron-causal" in point["methods"]
    for point in scalability.points(True):
        assert "megatron-causal" in point["methods"]
    assert "megatron-causal" in outliers.BASELINES


def test_speedup_claims_bracket_megatron_and_megatron_causal():
    records = pd.DataFrame(_rows(1, megatron=100.0, **{"megatron-causal": 40.0}, slimpack=120.0)
                           + _rows(2, megatron=100.0, **{"megatron-causal": 30.0}, slimpack=150.0))
    claims = {c.claim_id: c for c in e2e_throughput.claims(records)}
    top = claims["max-speedup"]
    assert top.bracket == (("megatron", 1.5), ("megatron-causal", 5.0))
    assert top.reproduced == 1.5  # the verdict judges the faithful (document-masked) baseline
    assert top.reproduced_text() == "1.50x vs megatron, 5.00x vs megatron-causal"
    assert claims["cc-256k-speedup"].bracket == (("megatron", 1.35), ("megatron-causal", 4.0))


def test_scalability_bracket_is_per_baseline():
    rows = []
    for gpus in scalability.GPUS:
        rows += [{"num_gpus": gpus, "method": m, "tokens_per_s": v * gpus}
                 for m, v in (("megatron", 1.0), ("megatron-causal", 0.25), ("slimpack", 1.2))]
    claim = {c.claim_id: c for c in scalability.claims(pd.DataFrame(rows))}["speedup-at-512"]
    assert [name for name, _ in claim.bracket] == ["megatron", "megatron-causal"]
    assert [round(v, 6) for _, v in claim.bracket] == [1.2, 4.8]


def test_bracket_must_start_with_the_reproduced_value():
    def make(value: float, bracket) -> Claim:
        return Claim(claim_id="c", text="t", source="s", paper_value="p", reproduced=value,
                     unit="x", check=Check(kind="at_least", target=1.0), hardware="h",
                     bracket=bracket)

    with pytest.raises(ValueError, match="bracket"):
        make(1.2, (("megatron", 3.3), ("megatron-causal", 1.2)))
    assert make(math.nan, (("megatron", math.nan), ("megatron-causal", 2.0))).reproduced_text() \
        == "n/a vs megatron, 2.00x vs megatron-causal"
