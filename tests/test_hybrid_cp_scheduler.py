"""Megatron-Core's hybrid-CP scheduling rules (baselines/hybrid_cp_scheduler.py), each case
traced by hand through the rules of ``BalancedCPScheduler`` (NVIDIA/Megatron-LM 00caa53,
megatron/core/pipeline_parallel/hybrid_cp_schedule.py)."""

from __future__ import annotations

import pytest

from baselines.hybrid_cp_scheduler import (
    equal_work_buckets,
    ranks_needed,
    schedule_rounds,
    work,
)
from slimpack.data import sample_batch


def _rounds(lengths, capacity, ranks):
    """Each round as (ranks, document lengths) per group."""
    docs = list(enumerate(lengths))
    return [[(g.ranks, [n for _, n in g.documents]) for g in groups]
            for groups in schedule_rounds(docs, capacity, ranks)]


def test_cp_size_is_the_next_power_of_two_of_the_ranks_a_document_fills():
    assert [ranks_needed(n, 4096) for n in (1, 100, 4096, 4097, 9000, 20000, 99999)] == [
        1, 1, 1, 2, 4, 8, 32]
    assert work(8192, 4096) == 8192**2 / 2 and work(8192, 4096, cp=8) == 8192**2 / 8


def test_buckets_close_at_110_percent_of_an_equal_share_or_to_feed_later_buckets():
    # sizes {4, 2, 1}: share = 139,460,608 / 3; [8192, 4096] = 50.3M stays under 1.1 x share
    docs = list(enumerate([16384, 8192, 4096, 4096, 2048, 1024]))
    assert [[n for _, n in b] for b in equal_work_buckets(docs, 4096)] == [
        [16384], [8192, 4096], [4096, 2048, 1024]]
    # one CP size: the last document is kept back for "the remaining bucket"
    docs = list(enumerate([5000, 5000, 4000, 1000]))
    assert [[n for _, n in b] for b in equal_work_buckets(docs, 10000)] == [
        [5000, 5000, 4000], [1000]]


def test_a_round_ends_when_no_bucket_head_finds_ranks():
    # Round 1: 16384 takes all 4 ranks, nothing else can be placed. Round 2: 8192 opens ranks
    # 0-1, the 4096s open ranks 2 and 3, 2048 and 1024 join the least-loaded cp1 group.
    assert _rounds([16384, 8192, 4096, 4096, 2048, 1024], 4096, 4) == [
        [((0, 1, 2, 3), [16384])],
        [((0, 1), [8192]), ((2,), [4096, 2048]), ((3,), [4096, 1024])]]


def test_the_busiest_group_gives_back_its_last_document_when_that_narrows_the_spread():
    # 5000 | 5000, then 4000 joins rank 0 (41M vs 25M) and 1000 rank 1 (26M): giving the 4000
    # back leaves 25M vs 26M; it runs alone next round, its group doubled to both idle ranks.
    assert _rounds([5000, 5000, 4000, 1000], 10000, 2) == [
        [((0,), [5000]), ((1,), [5000, 1000])],
        [((0, 1), [4000])]]


def test_idle_ranks_double_the_smallest_group():
    assert _rounds([8192, 1000], 4096, 4) == [[((0, 1), [8192]), ((2, 3), [1000])]]
    assert _rounds([1000], 4096, 8) == [[(tuple(range(8)), [1000])]]


def test_a_document_longer_than_every_rank_together_is_refused_by_name():
    with pytest.raises(ValueError, match="capacity_tokens=1000.*at least 2500"):
        schedule_rounds([(0, 10000)], 1000, 4)


def test_commoncrawl_batch_every_document_once_every_rank_busy_every_round():
    """A real Common Crawl batch at 256K on 32 ranks: each document scheduled exactly once,
    every round tiles the ranks with consecutive groups no smaller than each member needs."""
    batch = sample_batch("commoncrawl", num_sequences=512, context=262144, seed=2)
    capacity, ranks = 262144 // 8, 32
    rounds = schedule_rounds([(s.seq_id, s.length) for s in batch.sequences], capacity, ranks)
    seen = [d for groups in rounds for g in groups for d in g.documents]
    assert sorted(seen) == sorted((s.seq_id, s.length) for s in batch.sequences)
    for groups in rounds:
        assert [r for g in groups for r in g.ranks] == list(range(ranks))
        for g in groups:
            assert all(ranks_needed(n, capacity) <= len(g.ranks) for _, n in g.documents)
    assert rounds[0][0].documents[0][1] == max(batch.lengths)  # longest first
