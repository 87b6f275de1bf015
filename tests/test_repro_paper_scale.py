"""The paper-scale experiment: batch counted in tokens, the headline's rule, the search check."""

from __future__ import annotations

import pandas as pd

from repro.experiments import paper_scale
from repro.experiments.common import draw_batch


def test_the_batch_is_512_context_length_samples_of_tokens():
    point = paper_scale.points(quick=True)[0]
    batch = draw_batch(point, "paper-scale")
    assert sum(batch.lengths) == 512 * 262144 == point["token_budget"]
    assert max(batch.lengths) <= point["context"]


def _records(megatron_step: float, exhaustive: bool) -> pd.DataFrame:
    rows = [("megatron", megatron_step, exhaustive), ("megatron-causal", 1445.0, True),
            ("slimpack", 492.0, False)]
    return pd.DataFrame([{"point_key": "p", "dataset": "commoncrawl", "seed": 0, "method": m,
                          "tokens_per_s": 134217728 / step, "search_exhaustive": done}
                         for m, step, done in rows])


def test_headline_is_bracketed_and_its_rule_can_fail():
    claims = {c.claim_id: c for c in paper_scale.claims(_records(597.0, True))}
    headline = claims["paper-scale-speedup"]
    assert headline.verdict == "reproduced"
    assert dict(headline.bracket)["megatron-causal"] > dict(headline.bracket)["megatron"]
    assert claims["paper-scale-megatron-search-exhaustive"].verdict == "reproduced"
    # SlimPack slower than Megatron, or a capped Megatron search: both fail.
    slower = {c.claim_id: c for c in paper_scale.claims(_records(450.0, False))}
    assert slower["paper-scale-speedup"].verdict == "not reproduced"
    assert slower["paper-scale-megatron-search-exhaustive"].verdict == "not reproduced"
