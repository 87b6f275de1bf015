"""The simulator's numpy paths (CP sharding into arrays, attention work summed over arrays)
give exactly what the per-piece rules give."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.cost import AnalyticCostModel, kernels
from slimpack.cost.cp_sharding import shard_piece_arrays, shard_pieces
from slimpack.cost.kernel_model import default_cost_model
from slimpack.specs import hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec

pieces_strategy = st.lists(st.tuples(st.integers(0, 40_000), st.integers(0, 300_000)),
                           max_size=150)


def per_document_reference(pieces, cp):
    """The padding-free remainder rule written one token at a time: chunk c of a document
    of n tokens gets n // 2cp tokens; its r-th leftover token goes to rank
    (pointer + r) % cp, whose first leftover lengthens its early chunk, a second one its
    late chunk; the pointer carries over to the next document."""
    out = [[] for _ in range(cp)]
    pointer = 0
    for tokens, prefix in pieces:
        leftovers = [0] * cp
        for _ in range(tokens % (2 * cp)):
            leftovers[pointer] += 1
            pointer = (pointer + 1) % cp
        offset = prefix
        for chunk in range(2 * cp):
            rank = chunk if chunk < cp else 2 * cp - 1 - chunk
            extra = leftovers[rank] >= 1 if chunk < cp else leftovers[rank] == 2
            length = tokens // (2 * cp) + int(extra)
            if length:
                out[rank].append((length, offset))
            offset += length
    return out


@settings(max_examples=200, deadline=None)
@given(pieces=pieces_strategy, cp=st.sampled_from([2, 3, 4, 8, 32]))
def test_per_document_arrays_match_the_token_by_token_rule(pieces, cp):
    expected = per_document_reference(pieces, cp)
    assert shard_pieces(pieces, cp, "per-document") == expected
    arrays = shard_piece_arrays(pieces, cp, "per-document")
    assert [[tuple(p) for p in a.tolist()] for a in arrays] == expected
    # Every token of every piece lands on exactly one rank.
    assert sum(int(a[:, 0].sum()) for a in arrays) == sum(t for t, _ in pieces)


def per_sequence_reference(pieces, cp):
    """The packed buffer cut into 2cp equal chunks regardless of documents; chunk c goes to
    rank c or 2cp-1-c; each document's part of a chunk keeps its offset as KV prefix."""
    out = [[] for _ in range(cp)]
    total = sum(t for t, _ in pieces)
    bounds = [total * k // (2 * cp) for k in range(2 * cp + 1)]
    for chunk in range(2 * cp):
        rank = chunk if chunk < cp else 2 * cp - 1 - chunk
        start = 0
        for tokens, prefix in pieces:
            a, b = max(bounds[chunk], start), min(bounds[chunk + 1], start + tokens)
            if a < b:
                out[rank].append((b - a, prefix + a - start))
            start += tokens
    return out


@settings(max_examples=200, deadline=None)
@given(pieces=pieces_strategy, cp=st.sampled_from([2, 3, 4, 8, 32]))
def test_per_sequence_arrays_match_the_chunk_by_chunk_rule(pieces, cp):
    expected = per_sequence_reference(pieces, cp)
    assert shard_pieces(pieces, cp, "per-sequence") == expected


@settings(max_examples=200, deadline=None)
@given(pieces=pieces_strategy, causal=st.booleans())
def test_attention_work_is_the_same_summed_in_python_or_numpy(pieces, causal):
    expected_tiles = expected_queries = 0
    for tokens, prefix in pieces:
        if tokens:
            tiles, queries = kernels.attention_tiles(tokens, prefix, causal=causal)
            expected_tiles += tiles
            expected_queries += queries
    as_array = np.array(pieces, dtype=np.int64).reshape(-1, 2)
    assert kernels.attention_work(as_array, causal=causal) == (expected_tiles, expected_queries)
    assert kernels.attention_work(pieces, causal=causal) == (expected_tiles, expected_queries)


def test_layer_times_of_an_array_equal_those_of_its_pairs():
    cost = default_cost_model(model_preset("llama-13b"), hardware_preset("h800-80g"))
    pieces = [(4096, 0), (0, 7), (1000, 4096), (37, 0)] * 40  # 160 pieces: the numpy path
    listed = cost.layer_times(pieces, tp=4, recompute="selective")
    arrayed = cost.layer_times(np.array(pieces), tp=4, recompute="selective")
    assert arrayed.forward_s == listed.forward_s
    assert arrayed.backward_s == listed.backward_s


@settings(max_examples=100, deadline=None)
@given(per_rank=st.lists(pieces_strategy, min_size=1, max_size=8),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_batched_rank_layer_times_equal_one_call_per_rank(per_rank, recompute):
    cost = default_cost_model(model_preset("llama-7b"), hardware_preset("h800-80g"))
    arrays = [np.array(r, dtype=np.int64).reshape(-1, 2) for r in per_rank]
    batched = cost.rank_layer_times(arrays, tp=2, recompute=recompute)
    assert batched == [cost.layer_times(r, tp=2, recompute=recompute) for r in per_rank]


def _work_sums(pieces):
    kept = [(t, p) for t, p in pieces if t > 0]
    tiles, queries = kernels.attention_work(kept) if kept else (0, 0)
    return sum(t for t, _ in kept), tiles, queries


@settings(max_examples=150, deadline=None)
@given(lists=st.lists(pieces_strategy, min_size=1, max_size=12),
       tp=st.sampled_from([1, 2, 4, 8]),
       recompute=st.sampled_from(["none", "selective", "full"]),
       kind=st.sampled_from(["kernel", "analytic", "analytic-no-tp-comm"]))
def test_layer_times_of_work_equal_layer_times_to_the_last_bit(lists, tp, recompute, kind):
    model, hw = model_preset("llama-70b"), hardware_preset("h800")
    if kind == "kernel":
        cost = default_cost_model(model, hw)
    else:
        cost = AnalyticCostModel(model=model, hardware=hw, tp_comm=kind == "analytic")
    sums = np.array([_work_sums(pieces) for pieces in lists], dtype=np.int64)
    # A 2-D layout, as the simulator passes it: (rank, unit).
    shaped = sums.T.reshape(3, 1, -1)
    fwd, bwd = cost.layer_times_of_work(*shaped, tp=tp, recompute=recompute)
    expected = [cost.layer_times(pieces, tp=tp, recompute=recompute) for pieces in lists]
    assert fwd.shape == bwd.shape == (1, len(lists))
    assert fwd[0].tolist() == [t.forward_s for t in expected]
    assert bwd[0].tolist() == [t.backward_s for t in expected]


@settings(max_examples=150, deadline=None)
@given(pieces=pieces_strategy, tp=st.sampled_from([1, 2, 4, 8]),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_layer_times_of_sums_equal_layer_times_to_the_last_bit(pieces, tp, recompute):
    """The scalar form the redistribution's share search prices shortened ranks with; lists
    of 64 pieces and more are summed with numpy inside ``layer_times``."""
    cost = default_cost_model(model_preset("llama-70b"), hardware_preset("h800"))
    got = cost.layer_times_of_sums(*_work_sums(pieces), tp=tp, recompute=recompute)
    assert got == cost.layer_times(pieces, tp=tp, recompute=recompute)


def test_unfused_attention_has_no_pricing_from_sums():
    cost = default_cost_model(model_preset("llama-7b"), hardware_preset("h800"),
                              TrainingSpec(attention_kernel="unfused"))
    one = np.ones(3, dtype=np.int64)
    assert cost.layer_times_of_work(one, one, one) is None
    assert cost.layer_times_of_sums(1, 1, 1) is None
