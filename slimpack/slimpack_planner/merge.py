"""DP-Merge (*reconstructed*): outliers run on a temporary merge of k replicas with CP k.

A sequence is an outlier when one replica cannot run it well: its activations (the whole
sequence is in flight under slice-level scheduling) exceed a replica's memory, or its work
alone exceeds a replica's fair share of the batch, so no assignment could balance it. Rather
than raising CP for every sequence (Megatron's static CP), only the outliers are run, in a
phase of their own before the regular phase, by groups of k merged replicas whose CP degree
is ``k * cp``; k is the smallest power of two that fits and balances, widened while every
merged group still gets an outlier (the phase holds the whole cluster, so idle groups waste it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class MergeDecision:
    outliers: tuple[int, ...]
    """seq_ids run in the merge phase."""
    merge_factor: int
    """k: replicas per merged group (a power of two dividing dp)."""


def find_outliers(lengths: dict[int, int], work: dict[int, float], *, dp: int,
                  max_tokens_per_replica: int) -> MergeDecision:
    """Pick outliers and the merge factor k.

    ``max_tokens_per_replica`` is the longest sequence whose in-flight activations fit one
    replica. A sequence is an outlier if it is longer than that, or if its work exceeds the
    mean replica load (it would leave its replica the slowest however the rest is dealt).
    """
    if dp == 1:
        return MergeDecision(outliers=(), merge_factor=1)
    fair_share = sum(work.values()) / dp
    outliers = sorted((s for s in lengths
                       if lengths[s] > max_tokens_per_replica or work[s] > fair_share),
                      key=lambda s: -work[s])
    if not outliers:
        return MergeDecision(outliers=(), merge_factor=1)
    longest = max(lengths[s] for s in outliers)
    need_memory = math.ceil(longest / max(max_tokens_per_replica, 1))
    need_balance = math.ceil(max(work[s] for s in outliers) / fair_share)
    k = 1
    while k < max(need_memory, need_balance) and k < dp:
        k *= 2
    # The merge phase holds the whole cluster: with fewer merged groups than outliers' worth,
    # replicas sit idle in it, so widen the merge until every group has an outlier to run.
    while k * 2 <= dp and (dp // (k * 2)) >= len(outliers):
        k *= 2
    while dp % k:
        k //= 2
    # Merging 1 replica is no merge: nothing to gain unless memory forces it.
    if k == 1:
        return MergeDecision(outliers=(), merge_factor=1)
    return MergeDecision(outliers=tuple(outliers), merge_factor=k)
