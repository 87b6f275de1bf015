"""The memory experiment and the end-to-end experiments search configurations the same way
(`slimpack.compare.best_parallel`), so they agree on which layout each method runs and
whether it fits: before, `memory` said no layout of 128 GPUs fit FlexSP on llama-70b while
`e2e-throughput` planned it (the search was written twice, one copy without FlexSP's SP
pool)."""

from __future__ import annotations

import json

import pytest

from repro.experiments.common import best_record_rows, compare_rows

POINT = {"model": "llama-7b", "dataset": "wikipedia", "context": 16384, "num_gpus": 16,
         "global_batch": 96, "seed": 3, "hardware": "h800-80g"}
METHODS = ("megatron", "flexsp", "ulysses-static", "slimpipe", "slimpack")


@pytest.mark.parametrize("top_k", [1, 3])
def test_memory_and_end_to_end_rows_pick_the_same_layouts_and_memory_verdicts(top_k):
    full = best_record_rows(POINT, METHODS, "memory", top_k=top_k)
    e2e = compare_rows(POINT, METHODS, "e2e-throughput", auto_parallel_top_k=top_k)
    assert [r["method"] for r in full] == [r["method"] for r in e2e] == list(METHODS)
    for a, b in zip(full, e2e, strict=True):
        assert not a.get("error") and not b.get("error"), (a.get("error"), b.get("error"))
        assert json.loads(a["parallel"]) == json.loads(b["parallel"]), a["method"]
        assert str(a["oom"]) == str(b["oom"]), a["method"]
        assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-12), a["method"]
