"""WLB-LLM (arXiv 2503.17924): packing, outlier queues, sharding choice, Table 2 numbers."""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines.common.fixed_length import fixed_length_samples
from baselines.wlb_llm import OutlierQueues
from baselines.wlb_llm.outlier_queue import admit_and_release
from baselines.wlb_llm.packer import wlb_pack
from slimpack.batch import Batch, Sequence
from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.planning import imbalance_degree, microbatch_stage_times
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

wlb_plan = partial(plan_method, "wlb-llm")

CONTEXT = 131072
MICROBATCHES = 8  # 1M tokens per iteration: 2 micro-batches per pipeline stage at pp=4


def _wlb_lengths() -> np.ndarray:
    shared = Path(os.environ.get("SLIMPACK_SHARED_DIR", "/work/shared"))
    path = shared / "length_distributions" / "distca_dist_wlbllm.json"
    if not path.is_file():
        pytest.skip(f"WLB-LLM length sample not found at {path} (set SLIMPACK_SHARED_DIR)")
    return np.array(json.loads(path.read_text()), dtype=np.int64)


def _stream(lengths: np.ndarray, iterations: int, seed: int = 0) -> list[list[tuple[int, int]]]:
    """Iterations of documents, each filling MICROBATCHES * CONTEXT tokens."""
    rng = np.random.default_rng(seed)
    draws = rng.choice(lengths, size=iterations * 400)
    batches, pos, next_id = [], 0, 0
    for _ in range(iterations):
        docs, tokens = [], 0
        while tokens + int(draws[pos]) <= MICROBATCHES * CONTEXT:
            docs.append((next_id, int(draws[pos])))
            tokens += int(draws[pos])
            next_id += 1
            pos += 1
        pos += 1
        batches.append(docs)
    return batches


def _batch(docs) -> Batch:
    return Batch(sequences=tuple(Sequence(seq_id=i, length=n) for i, n in docs))


@pytest.fixture(scope="module")
def setup():
    model, hw = model_preset("llama-7b"), hardware_preset("h100")
    return model, hw, AnalyticCostModel(model=model, hardware=hw), ParallelSpec(
        tp=8, cp=2, pp=4, dp=1)


def test_packer_rules_least_loaded_then_shortest_then_carry():
    # Workload = length: 10 goes to mb 0, 9 to mb 1, 8 to mb 1 (least loaded is mb 1)...
    res = wlb_pack([10, 9, 8, 3], 2, 18, workload=float)
    assert sorted(map(sorted, res.microbatches)) == [[0, 3], [1, 2]]
    # A document that fits nowhere is carried to the next iteration.
    res = wlb_pack([10, 10, 9], 2, 18, workload=float)
    assert res.carried == [2]


def test_queue_releases_exactly_n_one_per_microbatch():
    q = OutlierQueues(thresholds=(100,))
    q, keep, rel = admit_and_release(q, [(0, 150), (1, 50)], 0, 2)
    assert keep == [(1, 50)] and rel == [[]] and q.num_held == 1
    q, keep, rel = admit_and_release(q, [(2, 120), (3, 130)], 1, 2)
    assert [h.seq_id for h in rel[0]] == [0, 2] and q.num_held == 1


def test_table2_imbalance_and_packing_overhead(setup):
    """WLB-LLM Table 2 (7B, 128K, 64 GPUs tp8 cp2 pp4): imbalance 1.44 with fixed-length
    packing, 1.05 with two outlier queues; packing in milliseconds. Tolerances: +-0.1 for the
    original (our length sample is DistCA's copy of the distribution), [1.02, 1.10] for two
    queues, < 50 ms per batch on this 2-core machine."""
    model, hw, cost, par = setup
    batches = _stream(_wlb_lengths(), 12)
    plain = []
    for docs in batches:
        samples = fixed_length_samples(_batch(docs), CONTEXT).samples
        plain.append(imbalance_degree([
            microbatch_stage_times(cost, [s.num_tokens for s in smp], tp=8, cp=2, pp=4).forward_s
            for smp in samples]))
    assert np.mean(plain) == pytest.approx(1.44, abs=0.1)

    results = {}
    for thresholds in ((), (CONTEXT // 2,), (CONTEXT // 4, CONTEXT // 2)):
        state, carried, arrivals, imbalance, delay, tokens, ms = (
            OutlierQueues(thresholds=thresholds), [], {}, [], 0.0, 0, [])
        for it, docs in enumerate(batches):
            started = time.perf_counter()
            p = wlb_plan(_batch(carried + docs), model, hw, par, cost, context=CONTEXT,
                         s_max=CONTEXT, num_microbatches=MICROBATCHES, queue_state=state,
                         iteration=it, arrivals=arrivals)
            ms.append(1e3 * (time.perf_counter() - started))
            state = p.metadata["queue_state"]
            carried = [tuple(d) for d in p.metadata["carried"]]
            for i, _ in carried:
                arrivals.setdefault(i, it)
            if it >= 2:  # let the queues fill
                imbalance.append(p.metadata["imbalance_degree_estimate"])
            delay += p.metadata["delay_token_iterations"]
            tokens += p.num_tokens
        results[len(thresholds)] = (np.mean(imbalance), delay / tokens, np.median(ms))
    assert 1.02 <= results[2][0] <= 1.10
    assert results[1][0] < results[0][0] and results[2][0] <= results[1][0] + 0.01
    assert 0 < results[2][1] < 2.0  # tokens are delayed, by less than two iterations
    assert all(r[2] < 50 for r in results.values())


def test_one_shot_plan_covers_batch_and_beats_fixed_length_balance(setup):
    model, hw, cost, par = setup
    docs = _stream(_wlb_lengths(), 1, seed=3)[0]
    p = wlb_plan(_batch(docs), model, hw, par, cost, context=CONTEXT)
    assert p.num_tokens == sum(n for _, n in docs)
    assert set(p.sequence_lengths) == {i for i, _ in docs}
    assert p.metadata["plan_seconds"] < 0.5
    for g in p.groups():
        assert g.cp_sharding in ("per-sequence", "per-document")


def test_bad_option_names_the_field(setup):
    model, hw, cost, par = setup
    with pytest.raises(ValueError, match="cp_sharding"):
        wlb_plan(_batch([(0, 10)]), model, hw, par, cost, cp_sharding="zigzag")
    with pytest.raises(ValueError, match="unknown option"):
        wlb_plan(_batch([(0, 10)]), model, hw, par, cost, queues=2)


def scan_pack(lengths, num_microbatches, s_max, workload, preplaced=()):
    """Algorithm 1 as written (arXiv 2503.17924): a linear scan for the least-loaded and the
    fewest-token micro-batch per document."""
    bins = [list(docs) for docs in preplaced] + [[] for _ in range(num_microbatches - len(preplaced))]
    loads = [sum(workload(lengths[i]) for i in b) for b in bins]
    tokens = [sum(lengths[i] for i in b) for b in bins]
    placed = {i for b in bins for i in b}
    carried = []
    for i in sorted((i for i in range(len(lengths)) if i not in placed),
                    key=lambda i: (-lengths[i], i)):
        target = min(range(num_microbatches), key=lambda m: (loads[m], m))
        if tokens[target] + lengths[i] > s_max:
            target = min(range(num_microbatches), key=lambda m: (tokens[m], m))
            if tokens[target] + lengths[i] > s_max:
                carried.append(i)
                continue
        bins[target].append(i)
        loads[target] += workload(lengths[i])
        tokens[target] += lengths[i]
    return bins, carried, loads, tokens


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 5000), max_size=80), num_microbatches=st.integers(1, 12),
       s_max=st.sampled_from([100, 1000, 5000, 20000]), flat=st.booleans(),
       preplace=st.booleans())
def test_compiled_packer_chooses_exactly_as_the_scan_of_algorithm_1(lengths, num_microbatches, s_max,
                                                                flat, preplace):
    # A flat workload (lengths // 100, often 0) makes ties: both must break them to the lowest
    # micro-batch index (the tournament trees' tie rule).
    workload = (lambda n: float(n // 100)) if flat else (lambda n: n * n * 1e-3 + n)
    preplaced = [[i] for i in range(min(num_microbatches, 2, len(lengths)))] if preplace else []
    got = wlb_pack(lengths, num_microbatches, s_max, workload, preplaced=preplaced)
    bins, carried, loads, tokens = scan_pack(lengths, num_microbatches, s_max, workload, preplaced)
    assert (got.microbatches, got.carried, got.workloads, got.tokens) == (bins, carried, loads,
                                                                         tokens)


def test_fitted_workload_packs_as_the_scan_calling_it_per_document(setup):
    """The planner's workload is applied to all lengths at once (``Workload.of_lengths``):
    the same float64 operations as calling it per document, so the packing, loads and tokens
    equal the scan's exactly on a real-length batch (Common Crawl profile, 1M tokens)."""
    from baselines.wlb_llm.workload import fit_workload
    from slimpack import data

    _, _, cost, _ = setup
    workload = fit_workload(cost, tp=8, cp=2)
    lengths = list(data.sample_batch("commoncrawl", token_budget=MICROBATCHES * CONTEXT,
                                     context=CONTEXT, seed=1).lengths)
    assert len(lengths) > 100
    vector = workload.of_lengths(np.asarray(lengths, dtype=np.int64))
    assert vector.tolist() == [workload(n) for n in lengths]
    preplaced = [[i] for i in range(2)]
    got = wlb_pack(lengths, MICROBATCHES, CONTEXT, workload, preplaced=preplaced)
    bins, carried, loads, tokens = scan_pack(lengths, MICROBATCHES, CONTEXT, workload, preplaced)
    assert (got.microbatches, got.carried, got.workloads, got.tokens) == (bins, carried, loads,
                                                                         tokens)


def test_steady_state_release_takes_the_first_outliers_of_each_queue_in_batch_order():
    """One-shot planning releases, per queue, the first M documents at its level (M: the
    micro-batches); the rest are packed. Checked against the rule applied one document at a
    time on a real-length batch, with queues that overflow (M = 2)."""
    from baselines.wlb_llm.iteration import _release_steady_state
    from slimpack import data

    lengths = data.sample_batch("commoncrawl", token_budget=MICROBATCHES * CONTEXT,
                                context=CONTEXT, seed=2).lengths
    docs = list(enumerate(int(n) for n in lengths))
    thresholds = (1024, 4096, 16384)
    queues = OutlierQueues(thresholds=thresholds)
    keep, released = [], [[] for _ in thresholds]
    for d in docs:
        level = queues.level(d[1])
        if level is not None and len(released[level]) < 2:
            released[level].append(d)
        else:
            keep.append(d)
    assert all(len(r) == 2 for r in released)  # every queue overflows: the cut is exercised
    assert _release_steady_state(docs, thresholds, 2) == (keep, released)
