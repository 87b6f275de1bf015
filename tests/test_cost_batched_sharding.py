"""Sharding every slice of a group in one numpy pass gives, buffer by buffer and rank by
rank, exactly the pieces :func:`shard_piece_arrays` gives slice by slice."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.cost.cp_sharding import shard_buffers, shard_piece_arrays

buffers_strategy = st.lists(
    st.lists(st.tuples(st.integers(0, 5_000), st.integers(0, 300_000)), min_size=1,
             max_size=12),
    min_size=1, max_size=10)


@settings(max_examples=300, deadline=None)
@given(buffers=buffers_strategy, cp=st.sampled_from([1, 2, 3, 4, 8, 32]),
       sharding=st.sampled_from(["per-sequence", "per-document"]))
def test_shard_buffers_equals_one_shard_per_buffer(buffers, cp, sharding):
    pieces = np.array([p for b in buffers for p in b], dtype=np.int64).reshape(-1, 2)
    first = np.cumsum([0] + [len(b) for b in buffers[:-1]])
    buffer, rank, chunks = shard_buffers(pieces, first, cp, sharding)
    got = {}
    for b, r, row in zip(buffer.tolist(), rank.tolist(), chunks.tolist(), strict=True):
        got.setdefault((b, r), []).append(tuple(row))
    expected = {}
    for b, listed in enumerate(buffers):
        for r, arr in enumerate(shard_piece_arrays(listed, cp, sharding)):
            if len(arr):
                expected[(b, r)] = [tuple(row) for row in arr.tolist()]
    assert got == expected
    # Sorted by (buffer, rank), as the simulator's per-unit sums expect.
    assert (np.diff(buffer * cp + rank) >= 0).all()


def _per_sequence_chunk_by_chunk(pieces: list[tuple[int, int]], cp: int) -> list[list]:
    """The rule written out chunk by chunk (the oracle): cut the buffer into 2cp chunks at
    ``total * k // 2cp``, rank i owns chunks i and 2cp-1-i, each chunk's overlap with every
    piece is one output piece, ``(tokens, prefix + offset into the piece)``."""
    total = sum(t for t, _ in pieces)
    chunks = 2 * cp
    owned: list[list] = [[] for _ in range(cp)]
    for chunk in range(chunks):
        lo, hi = total * chunk // chunks, total * (chunk + 1) // chunks
        rank = chunk if chunk < cp else chunks - 1 - chunk
        start = 0
        for tokens, prefix in pieces:
            a, b = max(start, lo), min(start + tokens, hi)
            if a < b:
                owned[rank].append((b - a, prefix + a - start))
            start += tokens
    return owned


@settings(max_examples=300, deadline=None)
@given(pieces=buffers_strategy.map(lambda bs: bs[0]), cp=st.sampled_from([2, 3, 4, 8, 32]))
def test_per_sequence_matches_the_rule_chunk_by_chunk(pieces, cp):
    got = [[tuple(row) for row in arr.tolist()]
           for arr in shard_piece_arrays(pieces, cp, "per-sequence")]
    assert got == _per_sequence_chunk_by_chunk(pieces, cp)


def test_per_sequence_cuts_each_buffer_on_its_own():
    # Two buffers: [(10, 0), (6, 100)] and [(8, 0)]; cp 2 per-sequence cuts each into 4 chunks.
    buffer, rank, chunks = shard_buffers(np.array([[10, 0], [6, 100], [8, 0]]),
                                         np.array([0, 2]), 2, "per-sequence")
    # Buffer 0 (16 tokens): chunks [0,4) [4,8) [8,12) [12,16); rank 0 owns chunks 0 and 3,
    # rank 1 chunks 1 and 2 (the second document starts at token 10 of the buffer).
    # Buffer 1 (8 tokens): chunks of 2; rank 0 owns [0,2) and [6,8).
    assert buffer.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert rank.tolist() == [0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert chunks.tolist() == [[4, 0], [4, 102], [4, 4], [2, 8], [2, 100],
                               [2, 0], [2, 6], [2, 2], [2, 4]]


@pytest.mark.parametrize("bad", [np.array([1, 2]), np.array([0, 0]), np.array([0, 5])])
def test_shard_buffers_rejects_bad_buffer_starts(bad):
    with pytest.raises(ValueError, match="first"):
        shard_buffers(np.ones((3, 2), dtype=np.int64), bad, 2, "per-document")


slices_strategy = st.lists(
    st.lists(st.tuples(st.integers(1, 5_000), st.integers(0, 300_000)), min_size=1,
             max_size=6),
    min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(slices=slices_strategy, cp=st.sampled_from([1, 2, 4, 8]),
       sharding=st.sampled_from(["per-sequence", "per-document"]), data=st.data())
def test_a_groups_shards_taken_once_are_each_slices_own(slices, cp, sharding, data):
    """``SliceShards`` (every slice of a group sharded in one pass, shared by the unit prices
    and the redistribution): per slice and rank the pieces ``shard_pieces`` gives that slice
    alone, and per (unit, rank) the sums ``unit_rank_sums`` computes from the units' own
    slices, whichever slices the units hold and in whatever order."""
    from slimpack.cost.cp_sharding import shard_pieces
    from slimpack.plan import Group, Segment, Slice, Unit
    from slimpack.sim.costs import SliceShards, unit_rank_sums

    built = tuple(Slice(slice_id=10 + i, segments=tuple(
        Segment(seq_id=j, start=start, end=start + tokens)
        for j, (tokens, start) in enumerate(segs))) for i, segs in enumerate(slices))
    ids = [sl.slice_id for sl in built]
    units = tuple(Unit(slice_ids=tuple(data.draw(st.permutations(ids))[:k]))
                  for k in data.draw(st.lists(st.integers(1, len(ids)), min_size=1,
                                              max_size=4)))
    group = Group(group_id=0, ranks=tuple(range(cp)), cp=cp, slices=built,
                  forward_units=units, backward_units=units, cp_sharding=sharding)
    shards = SliceShards(group)
    for sl in built:
        alone = shard_pieces([(seg.num_tokens, seg.start) for seg in sl.segments], cp, sharding)
        assert shards.rank_pieces(sl.slice_id) == alone

    def columns(q, p):
        return [q, q * p, np.where(p > 0, q, 0)]

    np.testing.assert_array_equal(unit_rank_sums(group, units, columns, shards),
                                  unit_rank_sums(group, units, columns))
