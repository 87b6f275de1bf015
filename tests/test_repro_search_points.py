"""The points the search scripts re-search (``repro.scripts.search_points``: ``cap_audit``,
``bound_reach``) are the committed best-layout records of the 512-sample batch, and each
point's batch is the one its records were made on (same sequences, same tokens)."""

from __future__ import annotations

import pytest

from repro.experiments.paper_scale import METHODS as PAPER_SCALE_METHODS
from repro.scripts.search_points import DOCUMENTS, EXPERIMENTS, method_row


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_points_are_the_best_layout_records_and_their_batches(name):
    experiment = EXPERIMENTS[name]
    points = experiment.points()
    assert points, f"{name}: no best-layout point of {experiment.samples} samples"
    for (model, dataset, workload), rows in points:
        assert set(rows["token_budget"]) == {experiment.samples * experiment.context}
        if "protocol" in rows.columns:
            assert set(rows["protocol"]) == {"best layout"}
        batch = experiment.batch(model, dataset, workload)
        # Every method's record of the point was made on this batch.
        assert set(rows["num_sequences"]) == {len(batch.lengths)}, (model, dataset, workload)
        assert set(rows["num_tokens"]) == {sum(batch.lengths)}, (model, dataset, workload)


def test_e2e_points_hold_both_workloads_and_paper_scale_every_method():
    e2e = EXPERIMENTS["e2e-throughput"].points()
    assert {workload for (_, _, workload), _ in e2e} == {"documents", "sample pieces"}
    (key, rows), = EXPERIMENTS["paper-scale"].points()
    assert key == ("llama-70b", "commoncrawl", DOCUMENTS)
    assert all(method_row(rows, m) is not None for m in PAPER_SCALE_METHODS)
    assert method_row(rows, "no-such-method") is None


def test_paper_scale_batch_refuses_another_workload():
    with pytest.raises(ValueError, match="workload must be 'documents'"):
        EXPERIMENTS["paper-scale"].batch("llama-70b", "commoncrawl", "sample pieces")
